// Chat conversations -> model text, byte for byte as Transformers' apply_chat_template renders
// them (hf-numerics.md §10). The real template text runs in mixtune's Jinja interpreter
// (jinja.h); the Qwen3 template ships inside the binary (chat_template_qwen3()), any other comes
// from the checkpoint (chat_format.h).
//
// Answer-only loss: chat_render_qwen3_spans() also returns, per assistant message, the byte span
// of the text the model is trained on: everything after "<|im_start|>assistant\n" up to and
// including "<|im_end|>" (the stop token must be learned), excluding the "\n" that follows it
// (the template writes it between turns; it is context, as in TRL/LLaMA-Factory ChatML masks).
// That span includes the "<think>...</think>" block where the template renders one. Other layouts
// (GPT-OSS's harmony) cut their spans by the same rule: after the generation prompt, through the
// closing token (chat_format.h).
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/jinja.h"

namespace mt {

struct ChatToolCall {
  std::string name;
  nlohmann::ordered_json arguments;  // a JSON string (written raw) or an object (written as json.dumps)
};

struct ChatMessage {
  std::string role;  // system, developer, user, assistant, tool
  std::string content;
  // The content was JSON null or absent (an assistant message with tool calls only; `content` is then "").
  // Templates see "" unless ChatOptions::null_content asks for null.
  bool content_null = false;
  // Absent (nullopt) and "" differ in the template: when set, even to "", it replaces the
  // <think>...</think> block parsed out of `content`. Qwen3's key.
  std::optional<std::string> reasoning_content;
  // An assistant's reasoning as GPT-OSS's template reads it (its analysis channel).
  std::optional<std::string> thinking;
  std::vector<ChatToolCall> tool_calls;  // assistant only
};

struct ChatOptions {
  bool add_generation_prompt = false;
  bool enable_thinking = true;
  nlohmann::ordered_json tools;  // null or an array of tool definitions (key order is kept in the text)
  // More template variables, as apply_chat_template's **kwargs (GPT-OSS: reasoning_effort,
  // model_identity, builtin_tools): null or an object; the names above are set by the fields.
  nlohmann::ordered_json template_kwargs;
  // strftime_now's clock (JinjaEnv::now): unset = the local time now, as Transformers.
  std::optional<int64_t> now;
  // Pass a null content (ChatMessage::content_null) to the template as null, as OpenAI clients and
  // Transformers do, instead of "". Off by default: the Qwen3 and GPT-OSS templates fail on a null
  // content under jinja2; DeepSeek-V3's renders tool calls only for a null one (its layout sets this).
  bool null_content = false;
};

// Byte offsets [begin, end) into the rendered text.
using ChatSpan = std::pair<size_t, size_t>;

struct ChatRender {
  std::string text;
  std::vector<ChatSpan> assistant_spans;  // one per assistant message, in order
};

// OpenAI-format messages: [{"role", "content", "reasoning_content"?, "thinking"?, "tool_calls"?:
// [{"type": "function", "function": {"name", "arguments"}}]}]. A flat call {"name", "arguments"} is
// accepted too (the templates read either). content may be null or missing only on an assistant
// message with tool calls (read as "", content_null set); a null reasoning_content or thinking is absent. Other keys
// (name, tool_call_id, ...) are ignored, as the templates ignore them. Errors are one line:
// "<what>: messages[2].role: unknown role 'foo' (valid: ...)".
std::vector<ChatMessage> chat_messages_from_json(const nlohmann::ordered_json& messages, std::string_view what);

// null or an array of objects; errors name "<what>: tools[i]".
nlohmann::ordered_json chat_tools_from_json(const nlohmann::ordered_json& tools, std::string_view what);

// null or an object whose keys are not the variables chat_render sets itself (messages, tools,
// add_generation_prompt, enable_thinking); errors name "<what>: chat_template_kwargs.<key>".
nlohmann::ordered_json chat_template_kwargs_from_json(const nlohmann::ordered_json& kwargs, std::string_view what);

// The messages as the template sees them (OpenAI-format dicts); a content_null content is written as
// null when `null_content`, else as "".
nlohmann::ordered_json chat_messages_to_json(const std::vector<ChatMessage>& messages, bool null_content = false);

// Renders with any HF chat template: variables messages, tools, add_generation_prompt,
// enable_thinking and template_kwargs; strftime_now reads options.now. Checks the messages first
// (roles, UTF-8, tool calls) with one-line errors.
std::string chat_render(const JinjaTemplate& tmpl, const std::vector<ChatMessage>& messages, const ChatOptions& options);

// The Qwen3 chat template (tokenizer_config.json of Qwen3 / Qwen3-MoE, 4,116 chars), compiled once.
std::string_view chat_template_qwen3();
const JinjaTemplate& chat_template_qwen3_compiled();

std::string chat_render_qwen3(const std::vector<ChatMessage>& messages, const ChatOptions& options);

// Render + assistant spans for the Qwen3 (ChatML) layout. Rejects messages or tools whose text
// contains "<|im_start|>" or "<|im_end|>" (the turn boundaries would be ambiguous, and the
// tokenizer would turn them into control tokens), naming the field.
ChatRender chat_render_qwen3_spans(const std::vector<ChatMessage>& messages, const ChatOptions& options);

}  // namespace mt
