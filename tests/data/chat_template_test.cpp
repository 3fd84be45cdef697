// Chat templates: the real Qwen3 and GPT-OSS templates run by mixtune's Jinja interpreter must give
// exactly what jinja2 3.1.2 renders the way Transformers does (goldens from
// tools/chat_goldens/make_chat_goldens.py), plus hand-checked assistant spans and input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "core/error.h"
#include "data/chat_format.h"
#include "data/chat_template.h"
#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "io/json_text.h"

namespace mt {
namespace {

using ojson = nlohmann::ordered_json;

std::string fixture_text(const std::string& name) {
  std::string path = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/chat/" + name;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ojson load_fixture(const std::string& name) {
  return json_parse_strict(fixture_text(name), "tests/fixtures/chat/" + name, 64);
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
            "data.jsonl line 3: messages[2].role: unknown role \"foo\" (valid: system, developer, user, assistant, tool)");
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
  EXPECT_EQ(parse(R"([{"role":"assistant","content":"x","thinking":["t"]}])"),
            "data.jsonl line 3: messages[0].thinking: expected a string, found array");
  EXPECT_EQ(error_of([] { chat_template_kwargs_from_json(ojson::parse(R"({"reasoning_effort":"low","tools":[]})"), "cfg"); }),
            "cfg: chat_template_kwargs.tools: set by mixtune itself, not by chat_template_kwargs");
  EXPECT_EQ(error_of([] { chat_template_kwargs_from_json(ojson::parse("[1]"), "cfg"); }),
            "cfg: chat_template_kwargs: expected an object or null, found array");
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
            "messages[0].role: unknown role \"bot\" (valid: system, developer, user, assistant, tool)");
  // Qwen3's template has no developer role: plain rendering drops the message (as HF), spans refuse it.
  EXPECT_EQ(chat_render_qwen3({msg("developer", "d"), msg("user", "u")}, {}), "<|im_start|>user\nu<|im_end|>\n");
  EXPECT_EQ(error_of([] { chat_render_qwen3_spans({msg("developer", "d"), msg("user", "u")}, {}); }),
            "messages[0].role: the Qwen3 template has no 'developer' role; the message would be dropped");
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

// ---- GPT-OSS (harmony) --------------------------------------------------------------------------

const std::string& gpt_oss_template_text() {
  static const std::string t = fixture_text("gpt_oss_chat_template.jinja");
  return t;
}

const JinjaTemplate& gpt_oss_template() {
  static const JinjaTemplate t = jinja_compile(gpt_oss_template_text(), "GPT-OSS chat template");
  return t;
}

// A golden case's options: add_generation_prompt and the other keyword arguments, the fixed clock.
ChatOptions gpt_oss_options(const ojson& c, int64_t now) {
  ChatOptions o;
  ojson kw = c.at("kwargs");
  o.add_generation_prompt = kw.at("add_generation_prompt").get<bool>();
  kw.erase("add_generation_prompt");
  if (!kw.empty()) o.template_kwargs = chat_template_kwargs_from_json(kw, "kwargs");
  o.tools = chat_tools_from_json(c.at("tools"), c.at("name").get<std::string>());
  o.now = now;
  return o;
}

// The interpreter on the golden's own JSON, untouched (flat tool calls, extra keys, ids).
std::string gpt_oss_render_raw(const ojson& c, int64_t now) {
  ojson vars = {{"messages", c.at("messages")}, {"tools", c.at("tools")}};
  for (const auto& [k, v] : c.at("kwargs").items()) vars[k] = v;
  JinjaEnv env;
  env.now = now;
  return jinja_render(gpt_oss_template(), vars, env);
}

TEST(ChatTemplateGptOss, FixtureIsTheGoldensTemplateAndItsLayoutIsRecognised) {
  ojson g = load_fixture("gpt_oss_goldens.json");
  EXPECT_EQ(gpt_oss_template_text(), g.at("template").get<std::string>());
  EXPECT_EQ(gpt_oss_template_text().size(), 16738u);  // bytes of openai/gpt-oss-20b's chat_template.jinja
  EXPECT_EQ(chat_format_of(gpt_oss_template_text()), &chat_format_gpt_oss());
  EXPECT_EQ(chat_format_of(chat_template_qwen3()), &chat_format_qwen3());
  EXPECT_EQ(chat_format_of("{{ messages[0].content }}"), nullptr);
  EXPECT_EQ(chat_format_names(), "Qwen3 (ChatML), GPT-OSS (harmony), DeepSeek-V3");
}

TEST(ChatTemplateGptOss, GoldensByteForByteWithExactSpans) {
  ojson g = load_fixture("gpt_oss_goldens.json");
  const int64_t now = g.at("now").get<int64_t>();
  ASSERT_GE(g.at("cases").size(), 30u);
  const ChatFormat& harmony = chat_format_gpt_oss();
  size_t with_spans = 0, refused = 0;
  for (const ojson& c : g.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    const std::string expected = c.at("expected").get<std::string>();
    EXPECT_NE(expected.find("Current date: 2025-08-05\n"), std::string::npos) << name;
    const std::vector<ChatMessage> msgs = chat_messages_from_json(c.at("messages"), name);
    const ChatOptions opt = gpt_oss_options(c, now);
    EXPECT_EQ(chat_render(gpt_oss_template(), msgs, opt), expected) << name;
    EXPECT_EQ(gpt_oss_render_raw(c, now), expected) << name;
    if (c.at("spans").is_null()) {
      // The template would drop part of this conversation: no spans, a one-line error naming the field.
      const std::string e = error_of([&] { harmony.render_spans(gpt_oss_template(), msgs, opt); });
      EXPECT_EQ(e.rfind("messages[", 0), 0u) << name << ": " << e;
      ++refused;
      continue;
    }
    const ChatRender r = harmony.render_spans(gpt_oss_template(), msgs, opt);
    EXPECT_EQ(r.text, expected) << name;
    std::vector<std::string> got;
    for (auto [b, e] : r.assistant_spans) {
      ASSERT_LE(b, e) << name;
      ASSERT_LE(e, expected.size()) << name;
      ASSERT_GE(b, 18u) << name;
      EXPECT_EQ(expected.substr(b - 18, 18), "<|start|>assistant") << name;
      got.push_back(expected.substr(b, e - b));
    }
    EXPECT_EQ(got, c.at("spans").get<std::vector<std::string>>()) << name;
    size_t n_assistant = 0;
    for (const auto& m : msgs) n_assistant += m.role == "assistant";
    EXPECT_EQ(r.assistant_spans.size(), n_assistant) << name;
    ++with_spans;
  }
  EXPECT_EQ(refused, 3u);
  EXPECT_GE(with_spans, 25u);
}

TEST(ChatTemplateGptOss, TemplateErrorsAreOneLineAsJinja2s) {
  ojson g = load_fixture("gpt_oss_goldens.json");
  const int64_t now = g.at("now").get<int64_t>();
  ASSERT_EQ(g.at("error_cases").size(), 6u);
  for (const ojson& c : g.at("error_cases")) {
    const std::string name = c.at("name").get<std::string>();
    const std::string jinja2_error = c.at("error").get<std::string>();
    const ChatOptions opt = gpt_oss_options(c, now);
    const std::string typed = error_of([&] { chat_render(gpt_oss_template(), chat_messages_from_json(c.at("messages"), name), opt); });
    const std::string raw = error_of([&] { gpt_oss_render_raw(c, now); });
    for (const std::string& e : {typed, raw}) {
      EXPECT_EQ(e.rfind("GPT-OSS chat template line ", 0), 0u) << name << ": " << e;
      EXPECT_EQ(e.find('\n'), std::string::npos) << name;
      // raise_exception's own message comes through verbatim.
      const std::string raised = "TemplateError: ";
      if (jinja2_error.rfind(raised, 0) == 0) {
        EXPECT_NE(e.find("raise_exception: " + jinja2_error.substr(raised.size())), std::string::npos) << name << ": " << e;
      }
    }
  }
}

TEST(ChatTemplateGptOss, SpansHandChecked) {
  ChatOptions o;
  o.now = 0;  // 1970-01-01
  ChatMessage a = msg("assistant", "4");
  a.thinking = "Add.";
  const ChatRender r = chat_format_gpt_oss().render_spans(gpt_oss_template(), {msg("developer", "Be terse."), msg("user", "2+2?"), a}, o);
  const std::string head =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
      "2024-06\nCurrent date: 1970-01-01\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
      "Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nBe terse."
      "\n\n<|end|><|start|>user<|message|>2+2?<|end|><|start|>assistant";
  const std::string span = "<|channel|>analysis<|message|>Add.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>";
  EXPECT_EQ(r.text, head + span);
  ASSERT_EQ(r.assistant_spans.size(), 1u);
  EXPECT_EQ(r.assistant_spans[0], ChatSpan(head.size(), head.size() + span.size()));
}

TEST(ChatTemplateGptOss, SpansRefuseAmbiguousOrDroppedText) {
  const ChatFormat& h = chat_format_gpt_oss();
  auto spans_error = [&](const std::vector<ChatMessage>& m, const ChatOptions& o = {}) {
    return error_of([&] { h.render_spans(gpt_oss_template(), m, o); });
  };
  EXPECT_EQ(spans_error({msg("user", "hi<|end|><|start|>assistant")}),
            "messages[0].content: contains the harmony control token '<|start|>'; assistant spans would be ambiguous");
  ChatMessage a = msg("assistant", "ok");
  a.thinking = "x<|return|>";
  EXPECT_EQ(spans_error({msg("user", "u"), a}),
            "messages[1].thinking: contains the harmony control token '<|return|>'; assistant spans would be ambiguous");
  ChatMessage call = msg("assistant", "");
  call.tool_calls.push_back({"f", ojson{{"x", "<|call|>"}}});
  EXPECT_EQ(spans_error({msg("user", "u"), call}),
            "messages[1].tool_calls[0].arguments: contains the harmony control token '<|call|>'; assistant spans would "
            "be ambiguous");
  ChatOptions kw;
  kw.template_kwargs = {{"model_identity", "I am <|constrain|>"}};
  EXPECT_EQ(spans_error({msg("user", "u")}, kw),
            "chat_template_kwargs: contains the harmony control token '<|constrain|>'; assistant spans would be ambiguous");
  EXPECT_EQ(spans_error({msg("system", "s"), msg("user", "u"), msg("developer", "late")}),
            "messages[2].role: the GPT-OSS template renders only a first system or developer message; this 'developer' "
            "message would be dropped");
  ChatMessage two = msg("assistant", "");
  two.tool_calls = {{"f", ojson::object()}, {"g", ojson::object()}};
  EXPECT_EQ(spans_error({msg("user", "u"), two}),
            "messages[1].tool_calls: the GPT-OSS template renders only a message's first tool call; 2 given");
  ChatMessage rc = msg("assistant", "a");
  rc.reasoning_content = "r";
  EXPECT_EQ(spans_error({msg("user", "u"), rc}),
            "messages[1].reasoning_content: the GPT-OSS template does not read it (its reasoning key is 'thinking')");
  // The template's own refusals come through as one line.
  EXPECT_EQ(spans_error({msg("user", "u"), msg("tool", "r")}),
            "GPT-OSS chat template line 319: raise_exception: Message has tool role, but there was no previous assistant "
            "message with a tool call!");
  ChatOptions effort;
  effort.template_kwargs = {{"reasoning_effort", 3}};
  EXPECT_EQ(spans_error({msg("user", "u")}, effort),
            "GPT-OSS chat template line 206: unsupported operand type(s) for +: 'str' and 'int'");
}

// ---- DeepSeek-V3 --------------------------------------------------------------------------------

constexpr std::string_view kDsBos = "<｜begin▁of▁sentence｜>", kDsEos = "<｜end▁of▁sentence｜>";

const ojson& deepseek_v3_goldens() {
  static const ojson g = load_fixture("deepseek_v3_goldens.json");
  return g;
}

const JinjaTemplate& deepseek_v3_template() {
  static const JinjaTemplate t = jinja_compile(chat_template_deepseek_v3(), "DeepSeek-V3 chat template");
  return t;
}

// A golden case's options as a caller gives them: add_generation_prompt, tools, the other keyword arguments.
ChatOptions deepseek_v3_options(const ojson& c) {
  ChatOptions o;
  ojson kw = c.at("kwargs");
  o.add_generation_prompt = kw.at("add_generation_prompt").get<bool>();
  kw.erase("add_generation_prompt");
  if (kw.contains("enable_thinking")) {
    o.enable_thinking = kw["enable_thinking"].get<bool>();
    kw.erase("enable_thinking");
  }
  if (!kw.empty()) o.template_kwargs = chat_template_kwargs_from_json(kw, "kwargs");
  o.tools = chat_tools_from_json(c.at("tools"), c.at("name").get<std::string>());
  return o;
}

// The interpreter on the golden's own JSON, untouched (null contents, ids, names), with the special tokens
// first and the keyword arguments over them, as apply_chat_template builds its variables.
std::string deepseek_v3_render_raw(const ojson& c) {
  ojson vars = deepseek_v3_goldens().at("special_tokens");
  vars["messages"] = c.at("messages");
  vars["tools"] = c.at("tools");
  vars["documents"] = nullptr;
  for (const auto& [k, v] : c.at("kwargs").items()) vars[k] = v;
  return jinja_render(deepseek_v3_template(), vars);
}

TEST(ChatTemplateDeepSeekV3, EmbeddedTemplateIsTheGoldensAndItsLayoutIsRecognised) {
  const ojson& g = deepseek_v3_goldens();
  const std::string text = g.at("template").get<std::string>();
  EXPECT_EQ(chat_template_deepseek_v3(), text);
  EXPECT_EQ(chat_template_deepseek_v3().size(), 2301u);  // bytes (2,145 characters)
  EXPECT_EQ(g.at("template_sha256"), "3b8267e54b67df6500f231ffa969955cc9d26b3444a291ced4eb96ca7d3ca1ea");
  EXPECT_EQ(g.at("special_tokens"),
            ojson({{"bos_token", kDsBos}, {"eos_token", kDsEos}, {"pad_token", kDsEos}}));
  EXPECT_EQ(chat_format_of(chat_template_deepseek_v3()), &chat_format_deepseek_v3());
  // Only this exact text: the R1 / V3-0324 templates lay tool calls and reasoning out differently.
  std::string other = text;
  other.replace(other.find("{{bos_token}}"), 13, "{{ bos_token }}");
  EXPECT_EQ(chat_format_of(other), nullptr);
  EXPECT_EQ(chat_format_names(), "Qwen3 (ChatML), GPT-OSS (harmony), DeepSeek-V3");
  // A plain render gets the tokenizer's special tokens and null contents; other layouts are left alone.
  ChatOptions plain;
  plain.template_kwargs = {{"eos_token", "E"}};
  const ChatOptions o = chat_options_for_template(chat_template_deepseek_v3(), plain);
  EXPECT_EQ(o.template_kwargs, ojson({{"bos_token", kDsBos}, {"eos_token", "E"}, {"pad_token", kDsEos}}));
  EXPECT_TRUE(o.null_content);
  const ChatOptions q = chat_options_for_template(chat_template_qwen3(), plain);
  EXPECT_EQ(q.template_kwargs, plain.template_kwargs);
  EXPECT_FALSE(q.null_content);
}

TEST(ChatTemplateDeepSeekV3, GoldensByteForByteWithExactSpans) {
  const ojson& g = deepseek_v3_goldens();
  ASSERT_GE(g.at("cases").size(), 30u);
  const ChatFormat& ds = chat_format_deepseek_v3();
  size_t with_spans = 0, refused = 0;
  for (const ojson& c : g.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    const std::string expected = c.at("expected").get<std::string>();
    const std::vector<ChatMessage> msgs = chat_messages_from_json(c.at("messages"), name);
    const ChatOptions opt = deepseek_v3_options(c);
    EXPECT_EQ(chat_render(deepseek_v3_template(), msgs, chat_options_for_template(chat_template_deepseek_v3(), opt)),
              expected)
        << name;
    EXPECT_EQ(deepseek_v3_render_raw(c), expected) << name;
    if (c.at("spans").is_null()) {
      // The template drops or garbles part of this conversation: no spans, a one-line error naming the field.
      const std::string e = error_of([&] { ds.render_spans(deepseek_v3_template(), msgs, opt); });
      EXPECT_TRUE(e.rfind("messages[", 0) == 0 || e.rfind("tools: ", 0) == 0) << name << ": " << e;
      EXPECT_EQ(e.find('\n'), std::string::npos) << name;
      ++refused;
      continue;
    }
    const ChatRender r = ds.render_spans(deepseek_v3_template(), msgs, opt);
    EXPECT_EQ(r.text, expected) << name;
    std::vector<std::string> got;
    for (auto [b, e] : r.assistant_spans) {
      ASSERT_LE(b, e) << name;
      ASSERT_LE(e, expected.size()) << name;
      const std::string_view before = std::string_view(expected).substr(0, b);
      EXPECT_TRUE(before.ends_with("<｜Assistant｜>") || before.ends_with("<｜tool▁outputs▁end｜>")) << name;
      got.push_back(expected.substr(b, e - b));
    }
    EXPECT_EQ(got, c.at("spans").get<std::vector<std::string>>()) << name;
    size_t n_assistant = 0;
    for (const auto& m : msgs) n_assistant += m.role == "assistant";
    EXPECT_EQ(r.assistant_spans.size(), n_assistant) << name;
    ++with_spans;
  }
  EXPECT_EQ(refused, 8u);
  EXPECT_GE(with_spans, 25u);
}

TEST(ChatTemplateDeepSeekV3, TemplateErrorsAreOneLine) {
  const ojson& g = deepseek_v3_goldens();
  ASSERT_EQ(g.at("error_cases").size(), 3u);
  for (const ojson& c : g.at("error_cases")) {
    const std::string name = c.at("name").get<std::string>();
    const std::string raw = error_of([&] { deepseek_v3_render_raw(c); });
    EXPECT_EQ(raw.rfind("DeepSeek-V3 chat template line ", 0), 0u) << name << ": " << raw;
    EXPECT_EQ(raw.find('\n'), std::string::npos) << name;
    // The typed messages fail where jinja2 does, except a missing content (read as null, OpenAI's form) and a
    // flat call (written in the nested form): those render the calls.
    const std::vector<ChatMessage> msgs = chat_messages_from_json(c.at("messages"), name);
    const ChatOptions opt = chat_options_for_template(chat_template_deepseek_v3(), deepseek_v3_options(c));
    const std::string typed = error_of([&] { chat_render(deepseek_v3_template(), msgs, opt); });
    if (c.at("typed_fails").get<bool>()) {
      EXPECT_EQ(typed, raw) << name;
    } else {
      EXPECT_EQ(typed, "<no error>") << name;
    }
  }
  // Where jinja2 fails, in mixtune's words (jinja2: TypeError: can only concatenate str (not "dict") to str;
  // UndefinedError: 'dict object' has no attribute 'content'). Line numbers count the newlines inside the
  // template's string literals.
  EXPECT_EQ(error_of([&] { deepseek_v3_render_raw(g.at("error_cases")[0]); }),
            "DeepSeek-V3 chat template line 5: unsupported operand type(s) for +: 'str' and 'dict'");
  EXPECT_EQ(error_of([&] { deepseek_v3_render_raw(g.at("error_cases")[1]); }),
            "DeepSeek-V3 chat template line 10: 'dict' has no key 'content'");
}

TEST(ChatTemplateDeepSeekV3, SpansHandChecked) {
  ChatMessage call = msg("assistant", "");
  call.content_null = true;
  call.tool_calls.push_back({"get_weather", "{\"city\": \"Paris\"}"});
  const std::vector<ChatMessage> m = {msg("system", "Be brief."), msg("user", "Weather?"), call, msg("tool", "21C"),
                                      msg("assistant", "21 degrees."), msg("user", "Thanks"), msg("assistant", "Bye.")};
  const ChatRender r = chat_format_deepseek_v3().render_spans(deepseek_v3_template(), m, {});
  const std::string head = std::string(kDsBos) + "Be brief.<｜User｜>Weather?<｜Assistant｜>";
  const std::string span0 =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
      "<｜tool▁call▁end｜>";
  const std::string mid0 = "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>21C<｜tool▁output▁end｜><｜tool▁outputs▁end｜>";
  const std::string span1 = "21 degrees." + std::string(kDsEos);
  const std::string mid1 = "<｜User｜>Thanks<｜Assistant｜>";
  const std::string span2 = "Bye." + std::string(kDsEos);
  EXPECT_EQ(r.text, head + span0 + mid0 + span1 + mid1 + span2);
  ASSERT_EQ(r.assistant_spans.size(), 3u);
  size_t at = head.size();
  EXPECT_EQ(r.assistant_spans[0], ChatSpan(at, at + span0.size()));
  at += span0.size() + mid0.size();
  EXPECT_EQ(r.assistant_spans[1], ChatSpan(at, at + span1.size()));
  at += span1.size() + mid1.size();
  EXPECT_EQ(r.assistant_spans[2], ChatSpan(at, at + span2.size()));
  EXPECT_EQ(at + span2.size(), r.text.size());

  // The mask over the text: trained bytes are exactly the three spans.
  std::string mask(r.text.size(), '.');
  for (auto [b, e] : r.assistant_spans) std::fill(mask.begin() + b, mask.begin() + e, 'x');
  EXPECT_EQ(std::count(mask.begin(), mask.end(), 'x'), static_cast<ptrdiff_t>(span0.size() + span1.size() + span2.size()));
  EXPECT_EQ(mask.substr(0, head.size()), std::string(head.size(), '.'));

  // Two calls: the template closes them with <｜tool▁calls▁end｜><｜end▁of▁sentence｜>, trained too; the
  // generation prompt after tool outputs is their end marker, not <｜Assistant｜>.
  ChatMessage two = call;
  two.tool_calls.push_back({"get_weather", "{\"city\": \"Oslo\"}"});
  ChatOptions gen;
  gen.add_generation_prompt = true;
  const ChatRender r2 =
      chat_format_deepseek_v3().render_spans(deepseek_v3_template(), {msg("user", "W?"), two, msg("tool", "a"), msg("tool", "b")}, gen);
  ASSERT_EQ(r2.assistant_spans.size(), 1u);
  const auto [b, e] = r2.assistant_spans[0];
  EXPECT_TRUE(r2.text.substr(b, e - b).ends_with("\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"));
  EXPECT_TRUE(r2.text.ends_with("<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>b<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"));
}

TEST(ChatTemplateDeepSeekV3, SpansRefuseDroppedGarbledOrAmbiguousText) {
  const ChatFormat& ds = chat_format_deepseek_v3();
  auto spans_error = [&](const std::vector<ChatMessage>& m, const ChatOptions& o = {}) {
    return error_of([&] { ds.render_spans(deepseek_v3_template(), m, o); });
  };
  auto calls = [](std::vector<ChatToolCall> c) {
    ChatMessage a = msg("assistant", "");
    a.content_null = true;
    a.tool_calls = std::move(c);
    return a;
  };
  EXPECT_EQ(spans_error({msg("user", "hi<｜Assistant｜>x")}),
            "messages[0].content: contains the DeepSeek-V3 marker '<｜Assistant｜>'; assistant spans would be ambiguous");
  EXPECT_EQ(spans_error({msg("user", "u"), calls({{"f", "{\"a\": \"<｜tool▁sep｜>\"}"}})}),
            "messages[1].tool_calls[0].arguments: contains the DeepSeek-V3 marker '<｜tool▁sep｜>'; assistant spans "
            "would be ambiguous");
  EXPECT_EQ(spans_error({msg("user", "u"), calls({{"f", ojson{{"a", 1}}}})}),
            "messages[1].tool_calls[0].arguments: expected a JSON string (the DeepSeek-V3 template writes it as given, "
            "and fails on an object as jinja2 does), found object");
  ChatMessage with_text = msg("assistant", "Let me look.");
  with_text.tool_calls.push_back({"f", "{}"});
  EXPECT_EQ(spans_error({msg("user", "u"), with_text}),
            "messages[1].tool_calls: the DeepSeek-V3 template renders tool calls only when content is null; with "
            "content \"Let me look.\" they would be dropped");
  EXPECT_EQ(spans_error({msg("user", "u"), calls({{"f", "{}"}}), msg("tool", "r"), calls({{"g", "{}"}})}),
            "messages[3].tool_calls: the DeepSeek-V3 template writes '<｜Assistant｜>' only before the conversation's "
            "first tool calls (messages[1]; its ns.is_first is never reset), so these would follow the previous turn "
            "without an assistant prompt");
  EXPECT_EQ(spans_error({msg("user", "u"), calls({{"f", "{}"}, {"g", "{}"}, {"h", "{}"}})}),
            "messages[1].tool_calls: the DeepSeek-V3 template closes the calls ('<｜tool▁calls▁end｜><｜end▁of▁sentence｜>') "
            "after each call from the second on; 3 calls would render as several closed blocks");
  EXPECT_EQ(spans_error({msg("developer", "d"), msg("user", "u")}),
            "messages[0].role: the DeepSeek-V3 template has no 'developer' role; the message would be dropped");
  ChatMessage rc = msg("assistant", "a");
  rc.reasoning_content = "r";
  EXPECT_EQ(spans_error({msg("user", "u"), rc}), "messages[1].reasoning_content: the DeepSeek-V3 template does not read it");
  ChatMessage th = msg("assistant", "a");
  th.thinking = "t";
  EXPECT_EQ(spans_error({msg("user", "u"), th}), "messages[1].thinking: the DeepSeek-V3 template does not read it");
  ChatOptions tools;
  tools.tools = ojson::array({ojson{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(spans_error({msg("user", "u")}, tools),
            "tools: the DeepSeek-V3 template does not render tool definitions (1 given would be dropped; describe them "
            "in the system message)");
  tools.tools = ojson::array();  // an empty list drops nothing
  EXPECT_EQ(spans_error({msg("user", "u")}, tools), "<no error>");
  ChatOptions bos;
  bos.template_kwargs = {{"bos_token", nullptr}};
  EXPECT_EQ(spans_error({msg("user", "u")}, bos), "chat_template_kwargs.bos_token: expected a string, found null");
}

TEST(ChatTemplate, NullContentIsKeptApartFromEmpty) {
  const auto m = chat_messages_from_json(
      ojson::parse(R"([{"role":"user","content":"u"},{"role":"assistant","content":null,"tool_calls":[{"name":"f","arguments":"{}"}]},)"
                   R"({"role":"assistant","tool_calls":[{"name":"g","arguments":"{}"}]},)"
                   R"({"role":"assistant","content":"","tool_calls":[{"name":"h","arguments":"{}"}]}])"),
      "");
  EXPECT_TRUE(m[1].content_null);
  EXPECT_TRUE(m[2].content_null);  // absent = null
  EXPECT_FALSE(m[3].content_null);
  EXPECT_FALSE(m[0].content_null);
  EXPECT_EQ(chat_messages_to_json(m)[1]["content"], "");  // the default, which the Qwen3 and GPT-OSS templates need
  EXPECT_TRUE(chat_messages_to_json(m, true)[1]["content"].is_null());
  EXPECT_TRUE(chat_messages_to_json(m, true)[2]["content"].is_null());
  EXPECT_EQ(chat_messages_to_json(m, true)[3]["content"], "");
  // Built in code: null only where the parser would allow it.
  ChatMessage bad = msg("user", "");
  bad.content_null = true;
  EXPECT_EQ(error_of([&] { chat_render_qwen3({bad}, {}); }),
            "messages[0].content: null only on an assistant message with tool calls, and then without text");
}

TEST(ChatFormat, TemplateFromModelDir) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mixtune_chat_format_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const char* name, const std::string& text) { std::ofstream(dir / name, std::ios::binary) << text; };
  const std::string d = dir.string();
  EXPECT_EQ(chat_template_from_model_dir(d), "");
  write("tokenizer_config.json", R"({"eos_token": "x"})");
  EXPECT_EQ(chat_template_from_model_dir(d), "");
  write("tokenizer_config.json", R"({"chat_template": "{{ 'cfg' }}"})");
  EXPECT_EQ(chat_template_from_model_dir(d), "{{ 'cfg' }}");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]})");
  EXPECT_EQ(chat_template_from_model_dir(d), "d");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "t"}]})");
  EXPECT_EQ(error_of([&] { chat_template_from_model_dir(d); }),
            (dir / "tokenizer_config.json").string() + ": chat_template: a list of named templates without one named \"default\"");
  write("tokenizer_config.json", R"({"chat_template": [{"name": 1}]})");
  EXPECT_EQ(error_of([&] { chat_template_from_model_dir(d); }),
            (dir / "tokenizer_config.json").string() + ": chat_template[0]: expected {\"name\": string, \"template\": string}");
  write("tokenizer_config.json", R"({"chat_template": 7})");
  EXPECT_EQ(error_of([&] { chat_template_from_model_dir(d); }),
            (dir / "tokenizer_config.json").string() + ": chat_template: expected a string or a list of named templates, found number");
  // chat_template.jinja wins over tokenizer_config.json, as in Transformers.
  write("chat_template.jinja", gpt_oss_template_text());
  EXPECT_EQ(chat_template_from_model_dir(d), gpt_oss_template_text());
  write("chat_template.jinja", "\xff");
  EXPECT_EQ(error_of([&] { chat_template_from_model_dir(d); }), (dir / "chat_template.jinja").string() + ": not valid UTF-8");
  fs::remove_all(dir);
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
