// Which chat layout a checkpoint's template renders, so the data pipeline can cut answer-only
// spans out of its text. One row per layout, each defined in its family file
// (chat_template_<family>.cpp) and recognised there from the template's text; nothing else tests a
// layout's name. Every cutter marks, per assistant message, the text after the generation prompt
// through the closing token the model must learn to write (chat_template.h).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "data/chat_template.h"
#include "data/jinja.h"

namespace mt {

struct ChatFormat {
  std::string_view name;  // for messages: "Qwen3 (ChatML)"
  // Whether this layout's cutter applies to a template with this text.
  bool (*renders)(std::string_view template_text) = nullptr;
  // Renders with `tmpl` (chat_render) and cuts one span per assistant message. Refuses, naming the
  // field, conversations whose spans would be ambiguous (control tokens in the text) or that the
  // template would render only in part (a message or tool call it drops).
  ChatRender (*render_spans)(const JinjaTemplate& tmpl, const std::vector<ChatMessage>& messages,
                             const ChatOptions& options) = nullptr;
  // Sets on `options` what Transformers passes this layout's template besides the conversation, for a
  // plain chat_render of it (render_spans does this itself); nullptr = nothing. DeepSeek-V3: the
  // tokenizer's bos/eos/pad tokens (under template_kwargs, where the caller's own keys win, as kwargs do in
  // apply_chat_template) and null contents passed as null.
  void (*prepare)(ChatOptions& options) = nullptr;
};

const ChatFormat& chat_format_qwen3();        // chat_template_qwen3.cpp
const ChatFormat& chat_format_gpt_oss();      // chat_template_gpt_oss.cpp
const ChatFormat& chat_format_deepseek_v3();  // chat_template_deepseek_v3.cpp

// DeepSeek-V3's chat template, verbatim from its tokenizer_config.json (2,145 characters); its layout
// recognises this exact text only.
std::string_view chat_template_deepseek_v3();

// The layout whose cutter applies to `template_text`, or nullptr.
const ChatFormat* chat_format_of(std::string_view template_text);
std::string chat_format_names();  // "Qwen3 (ChatML), GPT-OSS (harmony), DeepSeek-V3", for error messages

// `options` prepared for a plain chat_render with the template `template_text` (ChatFormat::prepare of
// its layout; unchanged when it has none or mixtune knows no layout for it).
ChatOptions chat_options_for_template(std::string_view template_text, ChatOptions options);

// A checkpoint's chat template, as Transformers loads it: <dir>/chat_template.jinja, else
// tokenizer_config.json's "chat_template" (a string, or the entry named "default" of a list of
// {"name", "template"}); "" when the directory has neither. Errors name the file and field.
std::string chat_template_from_model_dir(const std::string& dir);

}  // namespace mt
