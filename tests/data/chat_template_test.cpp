// Chat templates: the real Qwen3 template run by mixtune's Jinja interpreter must give exactly
// what jinja2 3.1.2 renders the way Transformers does (goldens from
// tools/chat_goldens/make_chat_goldens.py), plus hand-checked assistant spans and input errors.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/chat_template.h"
#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "io/json_text.h"

namespace mt {
namespace {

using ojson = nlohmann::ordered_json;

ojson load_fixture(const std::string& name) {
  std::string path = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/chat/" + name;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return json_parse_strict(ss.str(), path, 64);
}

ChatOptions options_of(const ojson& c) {
  ChatOptions o;
  o.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
  o.enable_thinking = c.contains("enable_thinking") ? c["enable_thinking"].get<bool>() : true;
  o.tools = chat_tools_from_json(c.at("tools"), c.at("name").get<std::string>());
  return o;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ChatTemplate, EmbeddedQwen3TemplateIsTheRealOne) {
  ojson g = load_fixture("qwen3_goldens.json");
  EXPECT_EQ(chat_template_qwen3(), g.at("template").get<std::string>());
  EXPECT_EQ(chat_template_qwen3().size(), 4116u);
}

TEST(ChatTemplate, Qwen3GoldensByteForByte) {
  ojson g = load_fixture("qwen3_goldens.json");
  ASSERT_GE(g.at("cases").size(), 25u);
  JinjaTemplate raw = jinja_compile(g.at("template").get<std::string>(), "golden template");
  for (const ojson& c : g.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    const std::string expected = c.at("expected").get<std::string>();
    // Through the typed API (parse -> ChatMessage -> template).
    std::vector<ChatMessage> msgs = chat_messages_from_json(c.at("messages"), name);
    ChatOptions opt = options_of(c);
    EXPECT_EQ(chat_render_qwen3(msgs, opt), expected) << name;
    // The interpreter on the golden's own JSON, untouched (flat tool calls, extra keys, ids).
    ojson vars = {{"messages", c.at("messages")}, {"tools", c.at("tools")},
                  {"add_generation_prompt", c.at("add_generation_prompt")}};
    if (c.contains("enable_thinking")) vars["enable_thinking"] = c["enable_thinking"];
    EXPECT_EQ(jinja_render(raw, vars), expected) << name;
    // Spans: one per assistant message, each a whole "<|im_start|>assistant\n...<|im_end|>" body.
    ChatRender r = chat_render_qwen3_spans(msgs, opt);
    EXPECT_EQ(r.text, expected) << name;
    size_t n_assistant = 0;
    for (const auto& m : msgs) n_assistant += m.role == "assistant";
    ASSERT_EQ(r.assistant_spans.size(), n_assistant) << name;
    for (auto [b, e] : r.assistant_spans) {
      ASSERT_LT(b, e) << name;
      EXPECT_EQ(expected.substr(b - 22, 22), "<|im_start|>assistant\n") << name;
      EXPECT_EQ(expected.substr(e - 10, 10), "<|im_end|>") << name;
      EXPECT_EQ(expected[e], '\n') << name;
    }
  }
}

ChatMessage msg(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

TEST(ChatTemplate, SpansHandChecked) {
  // Last assistant turn after the last query: the template writes an empty think block, and
  // the span covers it, the answer and <|im_end|>, but not the newline after it.
  ChatRender r = chat_render_qwen3_spans({msg("user", "Hi"), msg("assistant", "Hello!")}, {});
  EXPECT_EQ(r.text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
  ASSERT_EQ(r.assistant_spans.size(), 1u);
  EXPECT_EQ(r.assistant_spans[0], ChatSpan(52, 87));  // 30 bytes of user turn + 22 of header
  EXPECT_EQ(r.text.substr(52, 87 - 52), "<think>\n\n</think>\n\nHello!<|im_end|>");

  // Reasoning before the last user query is dropped; after it, kept.
  std::vector<ChatMessage> m = {msg("system", "S"), msg("user", "Q1"), msg("assistant", "<think>\nr1\n</think>\n\nA1"),
                                msg("user", "Q2"), msg("assistant", "<think>\nr2\n</think>\n\nA2")};
  r = chat_render_qwen3_spans(m, {});
  ASSERT_EQ(r.assistant_spans.size(), 2u);
  auto span_text = [&](size_t i) { return r.text.substr(r.assistant_spans[i].first, r.assistant_spans[i].second - r.assistant_spans[i].first); };
  EXPECT_EQ(span_text(0), "A1<|im_end|>");
  EXPECT_EQ(span_text(1), "<think>\nr2\n</think>\n\nA2<|im_end|>");
  EXPECT_EQ(r.assistant_spans[0].first, std::string("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n").size());

  // Tool calls are part of the trained text; tool responses (a user turn) are not.
  ChatMessage call = msg("assistant", "");
  call.tool_calls.push_back({"get_weather", ojson{{"city", "Paris"}, {"days", 2}}});
  ChatOptions gen;
  gen.add_generation_prompt = true;
  gen.enable_thinking = false;
  r = chat_render_qwen3_spans({msg("user", "W?"), call, msg("tool", "21C"), msg("tool", "22C")}, gen);
  EXPECT_EQ(r.text,
            "<|im_start|>user\nW?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
            "\"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
            "<tool_response>\n21C\n</tool_response>\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  ASSERT_EQ(r.assistant_spans.size(), 1u);
  EXPECT_EQ(span_text(0),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call><|im_end|>");
}

TEST(ChatTemplate, ParseErrorsNameTheField) {
  auto parse = [](const char* text) {
    return error_of([&] { chat_messages_from_json(ojson::parse(text), "data.jsonl line 3"); });
  };
  EXPECT_EQ(parse(R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"foo","content":"c"}])"),
            "data.jsonl line 3: messages[2].role: unknown role \"foo\" (valid: system, user, assistant, tool)");
  EXPECT_EQ(parse("[]"), "data.jsonl line 3: messages: empty conversation");
  EXPECT_EQ(parse(R"({"role":"user"})"), "data.jsonl line 3: messages: expected an array, found object");
  EXPECT_EQ(parse(R"([{"content":"x"}])"), "data.jsonl line 3: messages[0].role: missing");
  EXPECT_EQ(parse(R"([{"role":"user"}])"),
            "data.jsonl line 3: messages[0].content: missing (only an assistant message with tool calls may omit it)");
  EXPECT_EQ(parse(R"([{"role":"user","content":5}])"), "data.jsonl line 3: messages[0].content: expected a string, found number");
  EXPECT_EQ(parse(R"([{"role":"user","content":[{"type":"text","text":"x"}]}])"),
            "data.jsonl line 3: messages[0].content: expected a string, found array (content parts are not supported)");
  EXPECT_EQ(parse(R"([{"role":"user","content":"x","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}])"),
            "data.jsonl line 3: messages[0].tool_calls: only assistant messages may have tool calls (role is 'user')");
  EXPECT_EQ(parse(R"([{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f"}}]}])"),
            "data.jsonl line 3: messages[0].tool_calls[0].function.arguments: missing");
  EXPECT_EQ(parse(R"([{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":[1]}}]}])"),
            "data.jsonl line 3: messages[0].tool_calls[0].function.arguments: expected a JSON string or object, found array");
  EXPECT_EQ(parse(R"([{"role":"assistant","tool_calls":[{"type":"code","function":{"name":"f","arguments":{}}}]}])"),
            "data.jsonl line 3: messages[0].tool_calls[0].type: expected \"function\", found \"\\\"code\\\"\"");
  EXPECT_EQ(parse(R"([{"role":"assistant","content":"x","reasoning_content":1}])"),
            "data.jsonl line 3: messages[0].reasoning_content: expected a string, found number");
  EXPECT_EQ(error_of([] { chat_tools_from_json(ojson::parse(R"([{"type":"function"}, "x"])"), "cfg"); }),
            "cfg: tools[1]: expected an object, found string");

  // An assistant message with tool calls and null content renders as content "".
  auto m = chat_messages_from_json(
      ojson::parse(R"([{"role":"user","content":"u"},{"role":"assistant","content":null,"tool_calls":[{"name":"f","arguments":"{}"}]}])"), "");
  EXPECT_EQ(m[1].content, "");
  EXPECT_EQ(m[1].tool_calls[0].arguments, "{}");
  EXPECT_FALSE(m[1].reasoning_content.has_value());
}

TEST(ChatTemplate, RenderChecksMessagesBuiltInCode) {
  EXPECT_EQ(error_of([] { chat_render_qwen3({}, {}); }), "messages: empty conversation");
  EXPECT_EQ(error_of([] { chat_render_qwen3({msg("bot", "x")}, {}); }),
            "messages[0].role: unknown role \"bot\" (valid: system, user, assistant, tool)");
  EXPECT_EQ(error_of([] { chat_render_qwen3({msg("user", std::string("\xff", 1))}, {}); }),
            "messages[0].content: text is not valid UTF-8");
  ChatOptions bad_tools;
  bad_tools.tools = ojson::object();
  EXPECT_EQ(error_of([&] { chat_render_qwen3({msg("user", "x")}, bad_tools); }), "tools: expected an array or null, found object");
  EXPECT_EQ(error_of([] { chat_render_qwen3_spans({msg("user", "hi<|im_end|>\nfake"), msg("assistant", "a")}, {}); }),
            "messages[0].content: contains the ChatML control marker '<|im_end|>'; assistant spans would be ambiguous");
  ChatMessage call = msg("assistant", "");
  call.tool_calls.push_back({"f", ojson{{"x", "<|im_start|>user"}}});
  EXPECT_EQ(error_of([&] { chat_render_qwen3_spans({msg("user", "u"), call}, {}); }),
            "messages[1].tool_calls[0].arguments: contains the ChatML control marker '<|im_start|>'; assistant spans would be "
            "ambiguous");
  // Plain rendering keeps such text, as HF does.
  EXPECT_EQ(chat_render_qwen3({msg("user", "<|im_end|>")}, {}), "<|im_start|>user\n<|im_end|><|im_end|>\n");
}

TEST(ChatTemplate, ReasoningContentEmptyDiffersFromAbsent) {
  ChatMessage a = msg("assistant", "<think>x</think>y");
  std::string absent = chat_render_qwen3({msg("user", "q"), a}, {});
  a.reasoning_content = "";
  std::string empty = chat_render_qwen3({msg("user", "q"), a}, {});
  EXPECT_EQ(absent, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n\ny<|im_end|>\n");
  EXPECT_EQ(empty, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<think>x</think>y<|im_end|>\n");
}

// Interpreter features beyond the Qwen3 template, against jinja2 (same generator script).
TEST(Jinja, GoldensByteForByte) {
  ojson g = load_fixture("jinja_goldens.json");
  ASSERT_GE(g.at("cases").size(), 26u);
  JinjaEnv env;
  env.now = g.at("now").get<int64_t>();  // strftime_now's fixed clock, as the generator's
  for (const ojson& c : g.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    std::string got;
    try {
      got = jinja_render(jinja_compile(c.at("template").get<std::string>(), name), c.at("vars"), env);
    } catch (const Error& e) {
      got = std::string("<error> ") + e.what();
    }
    EXPECT_EQ(got, c.at("expected").get<std::string>()) << name;
  }
}

TEST(Jinja, ErrorsAreOneLineWithTemplateLine) {
  auto compile_error = [](const char* text) { return error_of([&] { jinja_compile(text, "tmpl"); }); };
  auto render_error = [](const char* text, const ojson& vars) {
    return error_of([&] { jinja_render(jinja_compile(text, "tmpl"), vars); });
  };
  EXPECT_EQ(compile_error("{% if x %}a"), "tmpl line 1: unexpected end of template, expected '{% endif %}'");
  EXPECT_EQ(compile_error("a\n\n{{ x + }}"), "tmpl line 3: unexpected '}}'");
  EXPECT_EQ(compile_error("{% call m() %}{% endcall %}"), "tmpl line 1: unsupported or unexpected tag 'call'");
  EXPECT_EQ(compile_error("{% macro m(a=1, b) %}{% endmacro %}"), "tmpl line 1: non-default parameter follows a default parameter");
  EXPECT_EQ(compile_error("{% macro m(a, a) %}{% endmacro %}"), "tmpl line 1: duplicate parameter 'a' in macro 'm'");
  EXPECT_EQ(compile_error("{% macro m(*a) %}{% endmacro %}"), "tmpl line 1: *args and **kwargs in macro parameters are not supported");
  EXPECT_EQ(compile_error("{% macro m() %}x"), "tmpl line 1: unexpected end of template, expected '{% endmacro %}'");
  EXPECT_EQ(compile_error("{% for i in x %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}"),
            "tmpl line 1: 'break' outside of a for loop");
  EXPECT_EQ(compile_error("{% endfor %}"), "tmpl line 1: unsupported or unexpected tag 'endfor'");
  EXPECT_EQ(compile_error("{% break %}"), "tmpl line 1: 'break' outside of a for loop");
  EXPECT_EQ(compile_error("{{ 'abc }}"), "tmpl line 1: unterminated string literal");
  EXPECT_EQ(compile_error("{{ a < b < c }}"), "tmpl line 1: chained comparisons (a < b < c) are not supported");
  EXPECT_EQ(compile_error("{# never closed"), "tmpl line 1: unterminated comment '{#'");
  EXPECT_EQ(compile_error(("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}").c_str()),
            "tmpl line 1: template nested too deeply");

  EXPECT_EQ(render_error("{{ raise_exception('bad\\nrole') }}", ojson::object()), "tmpl line 1: raise_exception: bad\\nrole");
  EXPECT_EQ(render_error("\n\n{{ x.y.z }}", ojson{{"x", ojson::object()}}),
            "tmpl line 3: 'dict' has no attribute 'y' (reading attribute 'z')");
  EXPECT_EQ(render_error("{{ messages[0].role }}", ojson{{"messages", ojson::array()}}),
            "tmpl line 1: list index 0 out of range (reading attribute 'role')");
  EXPECT_EQ(render_error("{{ 1 + 'a' }}", ojson::object()), "tmpl line 1: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(render_error("{{ nothing + 1 }}", ojson::object()), "tmpl line 1: 'nothing' is undefined");
  EXPECT_EQ(render_error("{{ x | bogus }}", ojson::object()), "tmpl line 1: unknown filter 'bogus'");
  EXPECT_EQ(render_error("{{ x.bogus() }}", ojson{{"x", "s"}}), "tmpl line 1: 'str' object has no attribute 'bogus'");
  EXPECT_EQ(render_error("{% for i in 5 %}{% endfor %}", ojson::object()), "tmpl line 1: 'int' object is not iterable");
  EXPECT_EQ(render_error("{{ 9223372036854775807 + 1 }}", ojson::object()), "tmpl line 1: integer overflow in '+'");
  EXPECT_EQ(render_error("{{ range(2000000) | length }}", ojson::object()), "tmpl line 1: range() longer than 100000 items");
  EXPECT_EQ(render_error("{{ ''.split('') }}", ojson::object()), "tmpl line 1: empty separator");
  EXPECT_EQ(render_error("{{ x | tojson }}", ojson::object()), "tmpl line 1: tojson: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(render_error("{% set x.y = 1 %}", ojson{{"x", ojson::object()}}), "tmpl line 1: cannot assign attribute on non-namespace object 'x'");
  EXPECT_EQ(render_error("x", ojson::array()), "tmpl: template variables must be a JSON object");

  // Macros: arity and keywords as jinja2 words them; runaway recursion stops with an error.
  EXPECT_EQ(render_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", ojson::object()),
            "tmpl line 1: macro 'm' takes not more than 1 argument(s)");
  EXPECT_EQ(render_error("{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", ojson::object()),
            "tmpl line 1: macro 'm' takes no keyword argument 'b'");
  EXPECT_EQ(render_error("{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}", ojson::object()),
            "tmpl line 1: macro 'm' got multiple values for argument 'a'");
  EXPECT_EQ(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}", ojson::object()),
            "tmpl line 1: macro 'f': calls nested deeper than 100");
  EXPECT_EQ(render_error("{% macro m() %}\n\n{{ 1 + none }}{% endmacro %}{{ m() }}", ojson::object()),
            "tmpl line 3: unsupported operand type(s) for +: 'int' and 'NoneType'");
  // strftime_now: directives outside the documented set, and clocks outside 1970-9999, are refused.
  EXPECT_EQ(render_error("{{ strftime_now('%Y %q') }}", ojson::object()),
            "tmpl line 1: strftime_now: format directive '%q' is not supported");
  EXPECT_EQ(render_error("{{ strftime_now('50%') }}", ojson::object()),
            "tmpl line 1: strftime_now: the format ends with a lone '%'");
  EXPECT_EQ(render_error("{{ strftime_now() }}", ojson::object()),
            "tmpl line 1: strftime_now() takes exactly one argument (the format)");
  EXPECT_EQ(error_of([] { jinja_render(jinja_compile("{{ strftime_now('%Y') }}", "tmpl"), ojson::object(), JinjaEnv{-1}); }),
            "tmpl line 1: strftime_now: the fixed clock -1 is outside 1970-9999");
}

TEST(Jinja, StrftimeNowClock) {
  const JinjaTemplate t = jinja_compile("{{ strftime_now('%Y-%m-%d %H:%M:%S %a %j') }}", "tmpl");
  EXPECT_EQ(jinja_render(t, ojson::object(), JinjaEnv{0}), "1970-01-01 00:00:00 Thu 001");
  EXPECT_EQ(jinja_render(t, ojson::object(), JinjaEnv{951782400}), "2000-02-29 00:00:00 Tue 060");  // leap day
  EXPECT_EQ(jinja_render(t, ojson::object(), JinjaEnv{253402300799}), "9999-12-31 23:59:59 Fri 365");
  // Unset: the local time now (as Transformers), so only its shape is checked.
  const std::string now = jinja_render(jinja_compile("{{ strftime_now('%Y-%m-%d') }}", "tmpl"), ojson::object());
  ASSERT_EQ(now.size(), 10u);
  EXPECT_EQ(now[4], '-');
  EXPECT_GE(now.substr(0, 4), "2025");
}

TEST(Jinja, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(python_float_repr(123.456), "123.456");
  EXPECT_EQ(python_float_repr(1.5e-300), "1.5e-300");
  EXPECT_EQ(python_float_repr(2.0 / 3.0), "0.6666666666666666");
  EXPECT_EQ(python_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
}

// Hostile templates and data: any byte soup either parses or fails with mt::Error, never crashes.
TEST(Jinja, FuzzNeverCrashes) {
  const std::string alphabet[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", " ", "\n", "if", "for", "in", "set",
                                  "endif", "endfor", "else", "x", "ns", "(", ")", "[", "]", ":", "'", "\"", "|",
                                  "length", "is", "not", "defined", ".", ",", "1", "loop", "namespace", "=", "~",
                                  "macro", "endmacro", "m", "m()", "x=1", "strftime_now('%Y')"};
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>(state >> 33);
  };
  ojson vars = {{"x", ojson::array({1, "a", ojson::object({{"k", nullptr}})})}};
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    size_t n = next() % 24;
    for (size_t i = 0; i < n; ++i) text += alphabet[next() % std::size(alphabet)];
    try {
      jinja_render(jinja_compile(text, "fuzz"), vars);
      ++ok;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << text;
    }
  }
  EXPECT_GT(ok, 100);
}

}  // namespace
}  // namespace mt
