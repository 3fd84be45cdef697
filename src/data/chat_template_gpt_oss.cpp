// GPT-OSS's chat layout (OpenAI's harmony format): how mixtune recognises its template and cuts the
// text it renders into assistant spans for answer-only loss. The template itself is the
// checkpoint's own chat_template.jinja (a copy: tests/fixtures/chat/gpt_oss_chat_template.jinja).
//
// The text is a run of messages "<|start|>HEADER<|message|>BODY" each closed by <|end|>, <|return|>
// (the last answer of a conversation rendered for training) or <|call|> (a tool call). An assistant
// message becomes one or two of them, each starting "<|start|>assistant": an analysis message (its
// `thinking`, which the template keeps only in the last answer, or in a tool call no later answer
// follows), then its final answer or its tool call. The span is what the model writes after the
// generation prompt "<|start|>assistant": from the end of that prompt through the closing token,
// including an inner "<|start|>assistant" between analysis and answer (the model writes that too).
// As for Qwen3, the prompt is context and the closing token is trained. Token boundaries: the span
// starts with <|channel|> or " to=functions..." after "assistant" and ends on a control token, so
// encoding the pieces apart gives the tokens of the whole text (tests/data/chat_template_test.cpp).
#include <string_view>

#include "core/error.h"
#include "data/chat_format.h"
#include "data/chat_template.h"

namespace mt {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kStart = "<|start|>", kMessage = "<|message|>", kEnd = "<|end|>", kReturn = "<|return|>",
                           kCall = "<|call|>";
// Every harmony control token: in any text the template writes they would make the layout ambiguous
// (and the tokenizer turns them into control tokens).
constexpr std::string_view kControl[] = {kStart, kMessage, kEnd, kReturn, kCall, "<|channel|>", "<|constrain|>"};
constexpr std::string_view kPrompt = "<|start|>assistant";  // the generation prompt

void check_control(const std::string& s, const std::string& field) {
  for (std::string_view mark : kControl)
    if (s.find(mark) != std::string::npos)
      fail("{}: contains the harmony control token '{}'; assistant spans would be ambiguous", field, mark);
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// Refuses what the template would render ambiguously or only in part.
void check_for_spans(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string f = fmt::format("messages[{}]", i);
    if (i > 0 && (m.role == "system" || m.role == "developer"))
      fail("{}.role: the GPT-OSS template renders only a first system or developer message; this '{}' message "
           "would be dropped", f, m.role);
    if (m.reasoning_content)
      fail("{}.reasoning_content: the GPT-OSS template does not read it (its reasoning key is 'thinking')", f);
    if (m.tool_calls.size() > 1)
      fail("{}.tool_calls: the GPT-OSS template renders only a message's first tool call; {} given", f,
           m.tool_calls.size());
    check_control(m.content, f + ".content");
    if (m.thinking) check_control(*m.thinking, f + ".thinking");
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      const std::string cf = fmt::format("{}.tool_calls[{}]", f, k);
      check_control(m.tool_calls[k].name, cf + ".name");
      const auto& a = m.tool_calls[k].arguments;
      check_control(a.is_string() ? a.get<std::string>() : a.dump(), cf + ".arguments");
    }
  }
  if (!options.tools.is_null()) check_control(options.tools.dump(), "tools");
  if (!options.template_kwargs.is_null()) check_control(options.template_kwargs.dump(), "chat_template_kwargs");
}

// One "<|start|>HEADER<|message|>BODY<close>" at `pos`.
struct Block {
  size_t begin = 0, end = 0;
  std::string_view header, close;
};

Block read_block(std::string_view t, size_t pos) {
  MT_CHECK(starts_with(t.substr(pos), kStart), "expected '<|start|>' at byte {}", pos);
  Block b;
  b.begin = pos;
  const size_t h = pos + kStart.size();
  const size_t m = t.find(kMessage, h);
  MT_CHECK(m != std::string_view::npos, "a message header without '<|message|>' at byte {}", pos);
  b.header = t.substr(h, m - h);
  const size_t body = m + kMessage.size();
  size_t close = std::string_view::npos;
  for (std::string_view c : {kEnd, kReturn, kCall}) {
    const size_t at = t.find(c, body);
    if (at < close) {
      close = at;
      b.close = c;
    }
  }
  MT_CHECK(close != std::string_view::npos, "an unterminated message at byte {}", pos);
  MT_CHECK(t.find(kStart, body) >= close, "a message inside the message at byte {}", pos);
  b.end = close + b.close.size();
  return b;
}

bool gpt_oss_renders(std::string_view template_text) {
  return template_text.find("<|start|>assistant<|channel|>final<|message|>") != std::string_view::npos &&
         template_text.find("<|return|>") != std::string_view::npos;
}

ChatRender gpt_oss_render_spans(const JinjaTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                const ChatOptions& options) {
  check_for_spans(messages, options);
  ChatRender r;
  r.text = chat_render(tmpl, messages, options);

  // Walk the messages as the template writes them; every byte is accounted for.
  const std::string_view t = r.text;
  size_t pos = 0;
  Block b = read_block(t, pos);
  MT_CHECK(b.header == "system", "expected the system message first, found '{}'", b.header);
  pos = b.end;
  const bool first_is_instructions = messages[0].role == "system" || messages[0].role == "developer";
  const bool developer = (first_is_instructions && !messages[0].content.empty()) ||
                         (options.tools.is_array() && !options.tools.empty());
  if (developer) {
    b = read_block(t, pos);
    MT_CHECK(b.header == "developer", "expected the developer message at byte {}, found '{}'", pos, b.header);
    pos = b.end;
  }
  for (size_t i = first_is_instructions ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    b = read_block(t, pos);
    if (m.role == "user") {
      MT_CHECK(b.header == "user", "messages[{}]: expected a user message at byte {}, found '{}'", i, pos, b.header);
    } else if (m.role == "tool") {
      MT_CHECK(starts_with(b.header, "functions.") && ends_with(b.header, " to=assistant<|channel|>commentary"),
               "messages[{}]: expected a tool result at byte {}, found '{}'", i, pos, b.header);
    } else {
      MT_CHECK(m.role == "assistant", "messages[{}]: unexpected role '{}'", i, m.role);
      MT_CHECK(starts_with(b.header, "assistant"), "messages[{}]: expected an assistant message at byte {}, found '{}'",
               i, pos, b.header);
      const size_t begin = b.begin + kPrompt.size();
      while (b.header == "assistant<|channel|>analysis" && b.close == kEnd) {
        b = read_block(t, b.end);
        MT_CHECK(starts_with(b.header, "assistant"), "messages[{}]: an analysis message without its answer at byte {}",
                 i, b.begin);
      }
      MT_CHECK((b.close == kCall) == !m.tool_calls.empty(), "messages[{}]: its rendering ends with '{}'", i, b.close);
      r.assistant_spans.emplace_back(begin, b.end);
    }
    pos = b.end;
  }
  const std::string_view tail = options.add_generation_prompt ? kPrompt : std::string_view();
  MT_CHECK(t.substr(pos) == tail, "unexpected text after the last message at byte {}", pos);
  return r;
}

}  // namespace

const ChatFormat& chat_format_gpt_oss() {
  static const ChatFormat f{"GPT-OSS (harmony)", &gpt_oss_renders, &gpt_oss_render_spans};
  return f;
}

}  // namespace mt
