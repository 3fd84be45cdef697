// Dataset::load (four line formats, answer-only labels, errors, truncation) with the real Qwen3 tokenizer
// (and GPT-OSS's for its chat layout), and DataLoader (packing layout, seeded order, epochs, resume) on hand-made pre-tokenized documents.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <unistd.h>

#include "core/error.h"
#include "data/chat_format.h"
#include "data/chat_template.h"
#include "data/jinja.h"
#include "io/json_text.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;

Tokenizer real_tokenizer(const std::string& name) {
  fs::path dir = fs::path(MIXTUNE_SOURCE_DIR) / ".deps/data";
  if (const char* d = std::getenv("MIXTUNE_DATA_DIR"); d && *d) dir = d;
  const fs::path p = dir / "tokenizers" / name / "tokenizer.json";
  if (!fs::exists(p)) throw std::runtime_error(p.string() + " is missing: run scripts/fetch-data.sh");
  return Tokenizer::from_file(p.string());
}

const Tokenizer& qwen3() {
  static const Tokenizer tok = real_tokenizer("qwen3");
  return tok;
}

const Tokenizer& gptoss() {
  static const Tokenizer tok = real_tokenizer("gptoss");
  return tok;
}

const Tokenizer& deepseek_v3() {
  static const Tokenizer tok = real_tokenizer("deepseek_v3");
  return tok;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A JSONL file under the temp dir, removed at the end of the test.
struct TempJsonl {
  fs::path path;
  explicit TempJsonl(const std::string& text) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() /
           ("mixtune_dataset_" + std::to_string(::getpid()) + "_" + info->name() + "_" + std::to_string(counter()++) +
            ".jsonl");
    std::ofstream(path, std::ios::binary) << text;
  }
  ~TempJsonl() { std::error_code ec; fs::remove(path, ec); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

DatasetOptions opts(const TempJsonl& f, int64_t seq_len = 4096) {
  DatasetOptions o;
  o.path = f.path.string();
  o.seq_len = seq_len;
  return o;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Ids concat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(Dataset, ChatTrainsExactlyOnAssistantTokens) {
  const Tokenizer& tok = qwen3();
  const json messages = json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You're welcome."}])");
  TempJsonl f(json{{"messages", messages}}.dump() + "\n");
  const Dataset d = Dataset::load(opts(f), &tok, tok.vocab_size());
  ASSERT_EQ(d.examples().size(), 1u);
  const Example& ex = d.examples()[0];

  // Piecewise encoding equals encoding the whole rendered text at once.
  ChatOptions co;
  co.enable_thinking = false;  // the dataset's default
  const std::string text = chat_render_qwen3(chat_messages_from_json(messages, "t"), co);
  EXPECT_EQ(ex.input_ids, tok.encode(text));
  ASSERT_EQ(ex.labels.size(), ex.input_ids.size());

  // Maximal runs of trained labels; each trained label equals its token.
  std::vector<Ids> runs;
  std::vector<size_t> run_starts;
  for (size_t i = 0; i < ex.labels.size(); ++i) {
    if (ex.labels[i] == -100) continue;
    EXPECT_EQ(ex.labels[i], ex.input_ids[i]) << i;
    if (i == 0 || ex.labels[i - 1] == -100) {
      runs.emplace_back();
      run_starts.push_back(i);
    }
    runs.back().push_back(ex.labels[i]);
  }
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(tok.decode(runs[0]), "4<|im_end|>");
  EXPECT_EQ(tok.decode(runs[1]), "<think>\n\n</think>\n\nYou're welcome.<|im_end|>");
  const int32_t im_start = *tok.token_to_id("<|im_start|>");
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(runs[r].back(), *tok.token_to_id("<|im_end|>"));
    // Just before the run: <|im_start|> "assistant" "\n" (all context).
    const size_t s = run_starts[r];
    ASSERT_GE(s, 3u);
    EXPECT_EQ(ex.input_ids[s - 3], im_start);
    EXPECT_EQ(tok.decode({ex.input_ids[s - 2], ex.input_ids[s - 1]}), "assistant\n");
  }
  EXPECT_EQ(d.stats().trained_tokens, static_cast<int64_t>(runs[0].size() + runs[1].size()));
  EXPECT_EQ(d.stats().tokens, static_cast<int64_t>(ex.input_ids.size()));
  EXPECT_EQ(d.stats().examples, 1);
  EXPECT_EQ(d.stats().lines, 1);
}

// The GPT-OSS layout end to end: the model's own template (the fixture), every golden conversation the
// layout cuts, the real GPT-OSS tokenizer. Encoding the pieces equals encoding the whole text, and the
// trained tokens are exactly the spans.
TEST(Dataset, GptOssChatTrainsExactlyOnAssistantSpans) {
  const Tokenizer& tok = gptoss();
  const fs::path fixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/chat";
  const std::string tmpl_text = read_text(fixtures / "gpt_oss_chat_template.jinja");
  const json g = json_parse_strict(read_text(fixtures / "gpt_oss_goldens.json"), "gpt_oss_goldens.json", 64);
  std::string lines;
  std::vector<json> cases;
  for (const json& c : g.at("cases")) {
    if (c.at("spans").is_null()) continue;
    json kw = c.at("kwargs");
    kw.erase("add_generation_prompt");  // training renders without the generation prompt
    json line = {{"messages", c.at("messages")}, {"tools", c.at("tools")}};
    if (!kw.empty()) line["chat_template_kwargs"] = kw;
    lines += line.dump() + "\n";
    cases.push_back(c);
  }
  TempJsonl f(lines);
  DatasetOptions o = opts(f);
  o.chat_template = tmpl_text;
  o.chat_now = g.at("now").get<int64_t>();
  const Dataset d = Dataset::load(o, &tok, tok.vocab_size());
  ASSERT_EQ(d.examples().size(), cases.size());
  const JinjaTemplate tmpl = jinja_compile(tmpl_text, "GPT-OSS chat template");
  const int32_t start = *tok.token_to_id("<|start|>");
  int64_t trained = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    const std::string name = c.at("name").get<std::string>();
    const Example& ex = d.examples()[i];
    ChatOptions co;
    co.tools = c.at("tools");
    co.now = o.chat_now;
    json kw = c.at("kwargs");
    kw.erase("add_generation_prompt");
    if (!kw.empty()) co.template_kwargs = kw;
    const ChatRender r = chat_format_gpt_oss().render_spans(tmpl, chat_messages_from_json(c.at("messages"), name), co);
    EXPECT_EQ(ex.input_ids, tok.encode(r.text)) << name;
    ASSERT_EQ(ex.labels.size(), ex.input_ids.size()) << name;
    std::vector<Ids> runs;
    for (size_t k = 0; k < ex.labels.size(); ++k) {
      if (ex.labels[k] == -100) continue;
      EXPECT_EQ(ex.labels[k], ex.input_ids[k]) << name;
      if (k == 0 || ex.labels[k - 1] == -100) {
        runs.emplace_back();
        // Just before a run: <|start|> "assistant", the generation prompt (context).
        ASSERT_GE(k, 2u) << name;
        EXPECT_EQ(ex.input_ids[k - 2], start) << name;
        EXPECT_EQ(tok.decode({ex.input_ids[k - 1]}), "assistant") << name;
      }
      runs.back().push_back(ex.labels[k]);
      ++trained;
    }
    // Consecutive assistant messages are separate spans, but their runs are split by context tokens.
    std::vector<std::string> decoded;
    for (const Ids& run : runs) decoded.push_back(tok.decode(run));
    EXPECT_EQ(decoded.size(), r.assistant_spans.size()) << name;
    std::vector<std::string> spans;
    for (auto [b, e] : r.assistant_spans) spans.push_back(r.text.substr(b, e - b));
    EXPECT_EQ(decoded, spans) << name;
  }
  EXPECT_EQ(d.stats().trained_tokens, trained);

  // One case by hand: the trained tokens end on <|return|>, and the inner <|start|>assistant is trained.
  const Example& one = d.examples()[5];
  ASSERT_EQ(cases[5].at("name"), "single_exchange_thinking");
  Ids run;
  for (size_t k = 0; k < one.labels.size(); ++k)
    if (one.labels[k] != -100) run.push_back(one.labels[k]);
  EXPECT_EQ(tok.decode(run),
            "<|channel|>analysis<|message|>The user wants one colour.<|end|><|start|>assistant<|channel|>final<|message|>"
            "Blue.<|return|>");
  EXPECT_EQ(run.front(), *tok.token_to_id("<|channel|>"));
  EXPECT_EQ(run.back(), *tok.token_to_id("<|return|>"));
}

// The DeepSeek-V3 layout end to end: its template, every golden conversation the layout cuts, the real
// DeepSeek-V3 tokenizer. Encoding the pieces equals encoding the whole text (every span starts after an added
// token, <｜Assistant｜> or <｜tool▁outputs▁end｜>, and ends on one), and the trained tokens are exactly the spans.
TEST(Dataset, DeepSeekV3ChatTrainsExactlyOnAssistantSpans) {
  const Tokenizer& tok = deepseek_v3();
  const fs::path fixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/chat";
  const json g = json_parse_strict(read_text(fixtures / "deepseek_v3_goldens.json"), "deepseek_v3_goldens.json", 64);
  std::string lines;
  std::vector<json> cases;
  for (const json& c : g.at("cases")) {
    if (c.at("spans").is_null()) continue;
    json kw = c.at("kwargs");
    kw.erase("add_generation_prompt");  // training renders without the generation prompt
    kw.erase("enable_thinking");        // set by mixtune itself (and not read by this template)
    json line = {{"messages", c.at("messages")}, {"tools", c.at("tools")}};
    if (!kw.empty()) line["chat_template_kwargs"] = kw;
    lines += line.dump() + "\n";
    cases.push_back(c);
  }
  TempJsonl f(lines);
  DatasetOptions o = opts(f);
  o.chat_template = std::string(chat_template_deepseek_v3());
  const Dataset d = Dataset::load(o, &tok, tok.vocab_size());
  ASSERT_EQ(d.examples().size(), cases.size());
  const JinjaTemplate tmpl = jinja_compile(o.chat_template, "DeepSeek-V3 chat template");
  const int32_t assistant = *tok.token_to_id("<｜Assistant｜>"), outputs_end = *tok.token_to_id("<｜tool▁outputs▁end｜>");
  int64_t trained = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    const std::string name = c.at("name").get<std::string>();
    const Example& ex = d.examples()[i];
    ChatOptions co;
    co.tools = c.at("tools");
    json kw = c.at("kwargs");
    kw.erase("add_generation_prompt");
    kw.erase("enable_thinking");
    if (!kw.empty()) co.template_kwargs = kw;
    const ChatRender r =
        chat_format_deepseek_v3().render_spans(tmpl, chat_messages_from_json(c.at("messages"), name), co);
    EXPECT_EQ(ex.input_ids, tok.encode(r.text)) << name;
    ASSERT_EQ(ex.labels.size(), ex.input_ids.size()) << name;
    std::vector<Ids> runs;
    for (size_t k = 0; k < ex.labels.size(); ++k) {
      if (ex.labels[k] == -100) continue;
      EXPECT_EQ(ex.labels[k], ex.input_ids[k]) << name;
      if (k == 0 || ex.labels[k - 1] == -100) {
        runs.emplace_back();
        ASSERT_GE(k, 1u) << name;  // just before a run: its generation prompt (context)
        EXPECT_TRUE(ex.input_ids[k - 1] == assistant || ex.input_ids[k - 1] == outputs_end) << name;
      }
      runs.back().push_back(ex.labels[k]);
      ++trained;
    }
    std::vector<std::string> decoded;
    for (const Ids& run : runs) decoded.push_back(tok.decode(run));
    std::vector<std::string> spans;
    for (auto [b, e] : r.assistant_spans) spans.push_back(r.text.substr(b, e - b));
    EXPECT_EQ(decoded, spans) << name;
    EXPECT_EQ(decoded, c.at("spans").get<std::vector<std::string>>()) << name;
  }
  EXPECT_EQ(d.stats().trained_tokens, trained);

  // One case by hand: the BOS is the first token (context), the tool call is trained up to its
  // <｜tool▁call▁end｜>, the answer after the tool outputs up to <｜end▁of▁sentence｜>.
  size_t k = 0;
  while (k < cases.size() && cases[k].at("name") != "tool_call_single") ++k;
  ASSERT_LT(k, cases.size());
  const Example& one = d.examples()[k];
  EXPECT_EQ(one.input_ids.front(), *tok.token_to_id("<｜begin▁of▁sentence｜>"));
  EXPECT_EQ(one.labels.front(), -100);
  std::vector<Ids> runs;
  for (size_t t = 0; t < one.labels.size(); ++t) {
    if (one.labels[t] == -100) continue;
    if (t == 0 || one.labels[t - 1] == -100) runs.emplace_back();
    runs.back().push_back(one.labels[t]);
  }
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].front(), *tok.token_to_id("<｜tool▁calls▁begin｜>"));
  EXPECT_EQ(runs[0].back(), *tok.token_to_id("<｜tool▁call▁end｜>"));
  EXPECT_EQ(runs[1].back(), *tok.token_to_id("<｜end▁of▁sentence｜>"));
  EXPECT_EQ(tok.decode(runs[1]), "It is 21 degrees in Paris.<｜end▁of▁sentence｜>");
}

// The template a DeepSeek-V3 tokenizer directory carries selects the layout, as the trainer picks it
// (chat_template_from_model_dir, then chat_format_of): the npm copy of the hub's tokenizer_config.json.
TEST(Dataset, DeepSeekV3TokenizerDirSelectsItsLayout) {
  fs::path dir = fs::path(MIXTUNE_SOURCE_DIR) / ".deps/data";
  if (const char* d = std::getenv("MIXTUNE_DATA_DIR"); d && *d) dir = d;
  const std::string tmpl = chat_template_from_model_dir((dir / "tokenizers" / "deepseek_v3").string());
  EXPECT_EQ(tmpl, chat_template_deepseek_v3());
  EXPECT_EQ(chat_format_of(tmpl), &chat_format_deepseek_v3());
  EXPECT_EQ(chat_format_of(chat_template_from_model_dir((dir / "tokenizers" / "qwen3").string())), &chat_format_qwen3());
}

TEST(Dataset, ChatTemplateMustBeAKnownLayout) {
  const Tokenizer& tok = qwen3();
  TempJsonl chat(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
                 "\n");
  DatasetOptions o = opts(chat);
  o.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
  o.skip_bad_lines = true;  // a configuration error is never skipped
  EXPECT_EQ(error_of([&] { Dataset::load(o, &tok, tok.vocab_size()); }),
            chat.path.string() + ": the model's chat template is not one whose assistant turns mixtune can mark for "
                                 "answer-only loss (known layouts: Qwen3 (ChatML), GPT-OSS (harmony), DeepSeek-V3)");
  o.chat_template = "{% for m in messages %}";
  EXPECT_EQ(error_of([&] { Dataset::load(o, &tok, tok.vocab_size()); }),
            chat.path.string() + ": the model's chat template line 1: unexpected end of template, expected '{% endfor %}'");
  // A file without chat lines never needs the template.
  TempJsonl text("{\"text\": \"plain\"}\n");
  DatasetOptions ot = opts(text);
  ot.chat_template = o.chat_template;
  EXPECT_EQ(Dataset::load(ot, &tok, tok.vocab_size()).stats().examples, 1);
  // The built-in Qwen3 text given explicitly tokenizes as the default.
  DatasetOptions oq = opts(chat);
  const Dataset dflt = Dataset::load(oq, &tok, tok.vocab_size());
  oq.chat_template = std::string(chat_template_qwen3());
  EXPECT_EQ(Dataset::load(oq, &tok, tok.vocab_size()).examples()[0].labels, dflt.examples()[0].labels);
  // Per-line keyword arguments reach the template; the variables mixtune sets are refused per line.
  TempJsonl kw(R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": true}})"
               "\n");
  EXPECT_EQ(error_of([&] { Dataset::load(opts(kw), &tok, tok.vocab_size()); }),
            kw.path.string() + ":1: chat_template_kwargs.enable_thinking: set by mixtune itself, not by chat_template_kwargs");
}

TEST(Dataset, ChatWithoutAssistantIsKeptUntrained) {
  const Tokenizer& tok = qwen3();
  TempJsonl f(R"({"messages": [{"role": "user", "content": "hello"}]})"
              "\n");
  const Dataset d = Dataset::load(opts(f), &tok, tok.vocab_size());
  ASSERT_EQ(d.examples().size(), 1u);
  EXPECT_EQ(d.examples()[0].input_ids, tok.encode("<|im_start|>user\nhello<|im_end|>\n"));
  EXPECT_EQ(d.stats().trained_tokens, 0);
}

TEST(Dataset, PromptCompletionMasksThePrompt) {
  const Tokenizer& tok = qwen3();
  TempJsonl f(R"({"prompt": "The capital of France is", "completion": " Paris."})"
              "\n");
  const Dataset d = Dataset::load(opts(f), &tok, tok.vocab_size());
  ASSERT_EQ(d.examples().size(), 1u);
  const Ids p = tok.encode("The capital of France is"), c = tok.encode(" Paris.");
  const int32_t eot = *tok.token_to_id("<|endoftext|>");
  EXPECT_EQ(eot, 151643);
  EXPECT_EQ(d.examples()[0].input_ids, concat({p, c, {eot}}));
  EXPECT_EQ(d.examples()[0].labels, concat({Ids(p.size(), -100), c, {eot}}));
  EXPECT_EQ(d.stats().trained_tokens, static_cast<int64_t>(c.size() + 1));
}

TEST(Dataset, TextTrainsOnEveryTokenPlusEos) {
  const Tokenizer& tok = qwen3();
  TempJsonl f("{\"text\": \"Hello world, this is text.\"}\n\n   \n{\"text\": \"\"}\n");
  const Dataset d = Dataset::load(opts(f), &tok, tok.vocab_size());
  ASSERT_EQ(d.examples().size(), 2u);
  const Ids want = concat({tok.encode("Hello world, this is text."), {151643}});
  EXPECT_EQ(d.examples()[0].input_ids, want);
  EXPECT_EQ(d.examples()[0].labels, want);
  EXPECT_EQ(d.examples()[1].input_ids, Ids{151643});  // empty text: just EOS
  EXPECT_EQ(d.stats().lines, 2);                      // blank lines are not counted
}

TEST(Dataset, PreTokenizedAsGiven) {
  TempJsonl f("{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n{\"input_ids\": [4, 5]}\n");
  const Dataset d = Dataset::load(opts(f), nullptr, 10);
  ASSERT_EQ(d.examples().size(), 2u);
  EXPECT_EQ(d.examples()[0].input_ids, (Ids{1, 2, 3}));
  EXPECT_EQ(d.examples()[0].labels, (Ids{-100, 2, 3}));
  EXPECT_EQ(d.examples()[1].labels, (Ids{4, 5}));
  EXPECT_EQ(d.stats().tokens, 5);
  EXPECT_EQ(d.stats().trained_tokens, 4);

  TempJsonl bad("{\"input_ids\": [1, 10]}\n");
  EXPECT_EQ(error_of([&] { Dataset::load(opts(bad), nullptr, 10); }),
            bad.path.string() + ":1: input_ids[1]: token id 10 is outside the vocabulary [0, 10)");
  TempJsonl bad_len("{\"input_ids\": [1, 2], \"labels\": [1]}\n");
  EXPECT_EQ(error_of([&] { Dataset::load(opts(bad_len), nullptr, 10); }),
            bad_len.path.string() + ":1: labels: has 1 values but input_ids has 2");
  TempJsonl bad_label("{\"input_ids\": [1, 2], \"labels\": [1, -1]}\n");
  EXPECT_EQ(error_of([&] { Dataset::load(opts(bad_label), nullptr, 10); }),
            bad_label.path.string() + ":1: labels[1]: token id -1 is outside the vocabulary [0, 10) and is not -100");
}

TEST(Dataset, MalformedLinesErrorOrAreSkipped) {
  const Tokenizer& tok = qwen3();
  TempJsonl f(
      "{\"text\": \"ok\"}\n"
      "{\"text\": \n"
      "{\"prompt\": \"p\"}\n"
      "{\"text\": 5}\n"
      "{\"foo\": 1}\n"
      "[1, 2]\n"
      "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n"
      "{\"input_ids\": []}\n");
  const std::string p = f.path.string();
  EXPECT_EQ(error_of([&] { Dataset::load(opts(f), &tok, tok.vocab_size()); }), p + ":2: line: not valid JSON");

  DatasetOptions o = opts(f);
  o.skip_bad_lines = true;
  const Dataset d = Dataset::load(o, &tok, tok.vocab_size());
  EXPECT_EQ(d.stats().lines, 8);
  EXPECT_EQ(d.stats().skipped_bad_lines, 7);
  EXPECT_EQ(d.stats().examples, 1);

  // Each bad line alone, for its message.
  auto only = [&](const std::string& line) {
    TempJsonl one(line + "\n");
    std::string e = error_of([&] { Dataset::load(opts(one), &tok, tok.vocab_size()); });
    const std::string prefix = one.path.string() + ":1: ";
    EXPECT_EQ(e.rfind(prefix, 0), 0u) << e;
    return e.substr(std::min(e.size(), prefix.size()));
  };
  EXPECT_EQ(only("{\"prompt\": \"p\"}"), "completion: missing");
  EXPECT_EQ(only("{\"text\": 5}"), "text: expected a string, found number");
  EXPECT_EQ(only("[1, 2]"), "line: expected a JSON object, found array");
  EXPECT_EQ(only(std::string(200000, '[') + std::string(200000, ']')), "line: expected a JSON object, found array");
  EXPECT_EQ(only("{\"text\": \"\xff\"}"), "line: not valid JSON");  // invalid UTF-8
  EXPECT_EQ(only("{\"foo\": 1}"),
            "line: no known format (expected a 'messages', 'prompt'+'completion', 'text' or 'input_ids' key)");
  EXPECT_EQ(only("{\"input_ids\": []}"), "input_ids: the example has no tokens");
  EXPECT_NE(only("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}").find("messages[0].role"),
            std::string::npos);
  // Markers inside content are rejected by the span renderer; the error still names file:line.
  EXPECT_NE(only(R"({"messages": [{"role": "user", "content": "a<|im_end|>b"}]})").find("<|im_end|>"),
            std::string::npos);

  // All lines bad and skipped: nothing to train on is an error.
  TempJsonl all_bad("{\"foo\": 1}\n");
  DatasetOptions ob = opts(all_bad);
  ob.skip_bad_lines = true;
  EXPECT_EQ(error_of([&] { Dataset::load(ob, &tok, tok.vocab_size()); }),
            all_bad.path.string() + ": no examples (1 lines, 1 skipped as malformed, 0 dropped as longer than 4096 tokens)");

  // A missing tokenizer is a configuration error, never skipped.
  TempJsonl text("{\"text\": \"x\"}\n");
  DatasetOptions ot = opts(text);
  ot.skip_bad_lines = true;
  EXPECT_EQ(error_of([&] { Dataset::load(ot, nullptr, 10); }),
            text.path.string() + ":1: text: this format needs a tokenizer, and none was given");
  TempJsonl missing("");
  DatasetOptions om = opts(missing);
  om.path += ".nope";
  EXPECT_EQ(error_of([&] { Dataset::load(om, nullptr, 10); }), om.path + ": cannot open");
}

TEST(Dataset, TruncationRightAndDrop) {
  TempJsonl f("{\"input_ids\": [1, 2, 3, 4, 5], \"labels\": [-100, -100, 3, 4, 5]}\n{\"input_ids\": [6, 7]}\n");
  DatasetOptions o = opts(f, 3);
  const Dataset right = Dataset::load(o, nullptr, 10);
  ASSERT_EQ(right.examples().size(), 2u);
  EXPECT_EQ(right.examples()[0].input_ids, (Ids{1, 2, 3}));
  EXPECT_EQ(right.examples()[0].labels, (Ids{-100, -100, 3}));
  EXPECT_EQ(right.stats().truncated, 1);
  EXPECT_EQ(right.stats().dropped_too_long, 0);
  EXPECT_EQ(right.stats().tokens, 5);

  o.truncation = "drop";
  const Dataset drop = Dataset::load(o, nullptr, 10);
  ASSERT_EQ(drop.examples().size(), 1u);
  EXPECT_EQ(drop.examples()[0].input_ids, (Ids{6, 7}));
  EXPECT_EQ(drop.stats().dropped_too_long, 1);
  EXPECT_EQ(drop.stats().truncated, 0);

  o.truncation = "left";
  EXPECT_EQ(error_of([&] { Dataset::load(o, nullptr, 10); }),
            "data.truncation: 'left' is not a valid choice (valid: right, drop)");
}

TEST(Dataset, CacheHitMissAndCorruption) {
  const Tokenizer& tok = qwen3();
  TempJsonl f("{\"text\": \"cached text\"}\n{\"prompt\": \"a\", \"completion\": \"b\"}\nnot json\n");
  const fs::path dir = f.path.string() + ".cache";
  DatasetOptions o = opts(f);
  o.cache_dir = dir.string();
  o.skip_bad_lines = true;
  const Dataset fresh = Dataset::load(o, &tok, tok.vocab_size());
  EXPECT_FALSE(fresh.stats().from_cache);
  auto cache_files = [&] {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
    return out;
  };
  ASSERT_EQ(cache_files().size(), 1u);  // no temp file left behind
  const fs::path cache = cache_files()[0];

  auto same = [](const Dataset& a, const Dataset& b) {
    ASSERT_EQ(a.examples().size(), b.examples().size());
    for (size_t i = 0; i < a.examples().size(); ++i) {
      EXPECT_EQ(a.examples()[i].input_ids, b.examples()[i].input_ids);
      EXPECT_EQ(a.examples()[i].labels, b.examples()[i].labels);
    }
    const DatasetStats &x = a.stats(), &y = b.stats();
    EXPECT_EQ(std::vector<int64_t>({x.lines, x.examples, x.skipped_bad_lines, x.truncated, x.dropped_too_long,
                                    x.tokens, x.trained_tokens}),
              std::vector<int64_t>({y.lines, y.examples, y.skipped_bad_lines, y.truncated, y.dropped_too_long,
                                    y.tokens, y.trained_tokens}));
  };
  const Dataset hit = Dataset::load(o, &tok, tok.vocab_size());
  EXPECT_TRUE(hit.stats().from_cache);
  EXPECT_EQ(hit.stats().skipped_bad_lines, 1);
  same(fresh, hit);

  // Another option -> another key (a second file); the first stays valid.
  DatasetOptions o2 = o;
  o2.seq_len = 3;
  EXPECT_FALSE(Dataset::load(o2, &tok, tok.vocab_size()).stats().from_cache);
  EXPECT_EQ(cache_files().size(), 2u);
  EXPECT_TRUE(Dataset::load(o, &tok, tok.vocab_size()).stats().from_cache);

  // A truncated or garbled cache file is ignored and rebuilt.
  fs::resize_file(cache, fs::file_size(cache) - 3);
  const Dataset rebuilt = Dataset::load(o, &tok, tok.vocab_size());
  EXPECT_FALSE(rebuilt.stats().from_cache);
  same(fresh, rebuilt);
  {
    std::fstream g(cache, std::ios::in | std::ios::out | std::ios::binary);
    g.seekp(-4, std::ios::end);
    const int32_t huge = 1 << 30;  // a label outside the vocabulary
    g.write(reinterpret_cast<const char*>(&huge), 4);
  }
  EXPECT_FALSE(Dataset::load(o, &tok, tok.vocab_size()).stats().from_cache);
  EXPECT_TRUE(Dataset::load(o, &tok, tok.vocab_size()).stats().from_cache);

  // The chat template and its clock are part of the key.
  DatasetOptions o3 = o;
  o3.chat_template = std::string(chat_template_qwen3());
  EXPECT_FALSE(Dataset::load(o3, &tok, tok.vocab_size()).stats().from_cache);
  EXPECT_TRUE(Dataset::load(o3, &tok, tok.vocab_size()).stats().from_cache);
  o3.chat_now = 0;
  EXPECT_FALSE(Dataset::load(o3, &tok, tok.vocab_size()).stats().from_cache);
  EXPECT_EQ(cache_files().size(), 4u);

  // Changing the data file changes the key.
  std::ofstream(f.path, std::ios::app) << "{\"text\": \"more\"}\n";
  const Dataset changed = Dataset::load(o, &tok, tok.vocab_size());
  EXPECT_FALSE(changed.stats().from_cache);
  EXPECT_EQ(changed.stats().examples, 3);
  fs::remove_all(dir);
}

// Documents i = 0..n-1 of the given lengths, tokens 100*(i+1)+k, labels = tokens.
Dataset make_docs(const std::vector<int>& lengths, std::unique_ptr<TempJsonl>& keep) {
  std::string text;
  for (size_t i = 0; i < lengths.size(); ++i) {
    json ids = json::array();
    for (int k = 0; k < lengths[i]; ++k) ids.push_back(100 * (i + 1) + k);
    text += json{{"input_ids", ids}}.dump() + "\n";
  }
  keep = std::make_unique<TempJsonl>(text);
  return Dataset::load(opts(*keep, 64), nullptr, 100000);
}

std::vector<int64_t> values(const Tensor& t) {
  const int64_t* p = t.data_as<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

TEST(DataLoader, PackingLayoutExact) {
  std::unique_ptr<TempJsonl> f;
  const Dataset d = make_docs({3, 2, 4, 1, 6}, f);
  LoaderOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 6;
  o.shuffle = false;
  o.pad_id = 7;
  DataLoader l(d, o);
  EXPECT_EQ(l.batches_per_epoch(), 2);
  MicroBatch b;
  ASSERT_TRUE(l.next(b));
  EXPECT_EQ(b.input_ids.shape(), (Shape{2, 6}));
  // Row 0: doc0 (3) + doc1 (2) + 1 pad; doc2 (4) does not fit. Row 1: doc2 (4) + doc3 (1) + 1 pad.
  EXPECT_EQ(values(b.input_ids), (std::vector<int64_t>{100, 101, 102, 200, 201, 7, 300, 301, 302, 303, 400, 7}));
  EXPECT_EQ(values(b.labels),
            (std::vector<int64_t>{-100, 101, 102, -100, 201, -100, -100, 301, 302, 303, -100, -100}));
  EXPECT_EQ(values(b.position_ids), (std::vector<int64_t>{0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 0}));
  EXPECT_EQ(b.valid_labels, 3 + 3);
  EXPECT_EQ(b.documents, 4);
  EXPECT_EQ(b.longest_row, 5);
  EXPECT_EQ(l.position().epoch, 0);
  EXPECT_EQ(l.position().cursor, 4);
  // Last batch of the epoch: one row, a full-length document, no padding.
  ASSERT_TRUE(l.next(b));
  EXPECT_EQ(b.input_ids.shape(), (Shape{1, 6}));
  EXPECT_EQ(values(b.input_ids), (std::vector<int64_t>{500, 501, 502, 503, 504, 505}));
  EXPECT_EQ(values(b.labels), (std::vector<int64_t>{-100, 501, 502, 503, 504, 505}));
  EXPECT_EQ(values(b.position_ids), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(b.valid_labels, 5);
  EXPECT_EQ(b.documents, 1);
  EXPECT_EQ(b.longest_row, 6);
  EXPECT_FALSE(l.next(b));
  EXPECT_FALSE(l.next(b));

  // Padding run longer than one token: positions 0..n-1.
  LoaderOptions o1 = o;
  o1.micro_batch_size = 1;
  o1.seq_len = 9;
  DataLoader l1(d, o1);
  ASSERT_TRUE(l1.next(b));  // doc0+doc1+doc2 = 9 exactly
  EXPECT_EQ(values(b.position_ids), (std::vector<int64_t>{0, 1, 2, 0, 1, 0, 1, 2, 3}));
  ASSERT_TRUE(l1.next(b));  // doc3 (1) + doc4 (6) = 7, then 2 padding
  EXPECT_EQ(values(b.input_ids), (std::vector<int64_t>{400, 500, 501, 502, 503, 504, 505, 7, 7}));
  EXPECT_EQ(values(b.position_ids), (std::vector<int64_t>{0, 0, 1, 2, 3, 4, 5, 0, 1}));
  EXPECT_EQ(values(b.labels), (std::vector<int64_t>{-100, -100, 501, 502, 503, 504, 505, -100, -100}));
  EXPECT_FALSE(l1.next(b));

  LoaderOptions short_seq = o;
  short_seq.seq_len = 5;
  EXPECT_EQ(error_of([&] { DataLoader bad(d, short_seq); }),
            "data loader: example 4 has 6 tokens, more than the loader's seq_len 5 (load the dataset with the same "
            "seq_len)");
}

TEST(DataLoader, NoPackingOneDocumentPerRow) {
  std::unique_ptr<TempJsonl> f;
  const Dataset d = make_docs({3, 2, 4, 1, 6}, f);
  LoaderOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 6;
  o.shuffle = false;
  o.pack = false;
  DataLoader l(d, o);
  EXPECT_EQ(l.batches_per_epoch(), 3);
  MicroBatch b;
  ASSERT_TRUE(l.next(b));
  EXPECT_EQ(values(b.input_ids), (std::vector<int64_t>{100, 101, 102, 0, 0, 0, 200, 201, 0, 0, 0, 0}));
  EXPECT_EQ(values(b.position_ids), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 3}));
  EXPECT_EQ(values(b.labels), (std::vector<int64_t>{-100, 101, 102, -100, -100, -100, -100, 201, -100, -100, -100, -100}));
  EXPECT_EQ(b.valid_labels, 3);
  EXPECT_EQ(b.documents, 2);
  ASSERT_TRUE(l.next(b));
  EXPECT_EQ(b.documents, 2);
  ASSERT_TRUE(l.next(b));
  EXPECT_EQ(b.input_ids.shape(), (Shape{1, 6}));
  EXPECT_FALSE(l.next(b));
}

// A batch is computed only up to its longest row (rounded up to 8 columns, at most seq_len): the same tokens,
// labels and positions in those columns, nothing but padding cut.
TEST(DataLoader, TrimmedToTheLongestRow) {
  EXPECT_EQ(trimmed_columns(3, 20), 8);
  EXPECT_EQ(trimmed_columns(8, 20), 8);
  EXPECT_EQ(trimmed_columns(9, 20), 16);
  EXPECT_EQ(trimmed_columns(17, 20), 20);
  EXPECT_EQ(trimmed_columns(0, 20), 8);
  EXPECT_EQ(trimmed_columns(3, 5), 5);
  std::unique_ptr<TempJsonl> f;
  const Dataset d = make_docs({3, 2, 9, 1, 6}, f);
  LoaderOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 20;
  o.shuffle = false;
  o.pack = false;
  DataLoader l(d, o);
  MicroBatch b;
  ASSERT_TRUE(l.next(b));
  EXPECT_EQ(b.longest_row, 3);
  MicroBatch t = micro_batch_trimmed(b, trimmed_columns(b.longest_row, o.seq_len));
  EXPECT_EQ(t.input_ids.shape(), (Shape{2, 8}));
  EXPECT_EQ(values(t.input_ids), (std::vector<int64_t>{100, 101, 102, 0, 0, 0, 0, 0, 200, 201, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(values(t.labels), (std::vector<int64_t>{-100, 101, 102, -100, -100, -100, -100, -100, -100, 201, -100,
                                                    -100, -100, -100, -100, -100}));
  EXPECT_EQ(values(t.position_ids), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(t.valid_labels, b.valid_labels);
  EXPECT_EQ(t.documents, b.documents);
  ASSERT_TRUE(l.next(b));  // docs of 9 and 1 tokens: 16 columns
  EXPECT_EQ(b.longest_row, 9);
  t = micro_batch_trimmed(b, trimmed_columns(b.longest_row, o.seq_len));
  EXPECT_EQ(t.labels.shape(), (Shape{2, 16}));
  EXPECT_EQ(values(t.input_ids)[8], 308);
  EXPECT_EQ(values(t.input_ids)[16], 400);
  // Full width: the batch itself; narrower than the longest row: refused.
  EXPECT_EQ(micro_batch_trimmed(b, 20).input_ids.data(), b.input_ids.data());
  EXPECT_NE(error_of([&] { micro_batch_trimmed(b, 8); }).find("micro-batch trimmed to 8 columns (longest row 9"),
            std::string::npos);
}

// First token of every document in a batch, in row order (documents start where position_ids == 0 and the
// token is not padding; pad_id 0 is never a document token here).
std::vector<int64_t> doc_heads(const MicroBatch& b) {
  std::vector<int64_t> out;
  const auto ids = values(b.input_ids), pos = values(b.position_ids);
  for (size_t i = 0; i < ids.size(); ++i)
    if (pos[i] == 0 && ids[i] != 0) out.push_back(ids[i]);
  return out;
}

std::vector<std::vector<int64_t>> drain(DataLoader& l) {
  std::vector<std::vector<int64_t>> out;
  MicroBatch b;
  while (l.next(b)) {
    std::vector<int64_t> all = values(b.input_ids);
    for (int64_t v : values(b.labels)) all.push_back(v);
    for (int64_t v : values(b.position_ids)) all.push_back(v);
    out.push_back(all);
  }
  return out;
}

TEST(DataLoader, SeededShuffleEpochsAndResume) {
  std::vector<int> lengths;
  for (int i = 0; i < 23; ++i) lengths.push_back(1 + (i * 7) % 9);
  std::unique_ptr<TempJsonl> f;
  const Dataset d = make_docs(lengths, f);
  LoaderOptions o;
  o.micro_batch_size = 3;
  o.seq_len = 12;
  o.epochs = 3;
  o.seed = 42;

  // Each epoch: every document exactly once, batches never mix epochs, a different order each epoch.
  DataLoader l(d, o);
  std::vector<std::vector<int64_t>> epoch_orders(3);
  std::vector<int64_t> batches_in_epoch(3, 0);
  MicroBatch b;
  while (true) {
    const int64_t e = l.position().epoch;
    const int64_t bpe = l.batches_per_epoch();
    if (!l.next(b)) break;
    ASSERT_LT(e, 3);
    if (batches_in_epoch[e] == 0) {
      EXPECT_GT(bpe, 0);
    }
    ++batches_in_epoch[e];
    for (int64_t h : doc_heads(b)) epoch_orders[e].push_back(h);
    EXPECT_TRUE(l.position().epoch == e || (l.position().epoch == e + 1 && l.position().cursor == 0));
    EXPECT_LE(b.input_ids.dim(0), 3);
  }
  std::vector<int64_t> sorted_heads;
  for (size_t i = 0; i < lengths.size(); ++i) sorted_heads.push_back(100 * (i + 1));
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> s = epoch_orders[e];
    std::sort(s.begin(), s.end());
    EXPECT_EQ(s, sorted_heads) << "epoch " << e;
    EXPECT_NE(epoch_orders[e], sorted_heads) << "epoch " << e << " not shuffled";
  }
  EXPECT_NE(epoch_orders[0], epoch_orders[1]);
  EXPECT_EQ(l.position().epoch, 3);
  EXPECT_FALSE(l.next(b));

  // batches_per_epoch matches what each epoch yielded (a fresh loader restored at each epoch's start).
  for (int e = 0; e < 3; ++e) {
    DataLoader le(d, o);
    le.restore({e, 0});
    EXPECT_EQ(le.batches_per_epoch(), batches_in_epoch[e]) << e;
  }

  // Same seed: identical batches; another seed: another order.
  DataLoader a(d, o), a2(d, o);
  const auto full = drain(a);
  EXPECT_EQ(full, drain(a2));
  LoaderOptions o2 = o;
  o2.seed = 43;
  DataLoader c(d, o2);
  EXPECT_NE(full, drain(c));
  LoaderOptions ns = o;
  ns.shuffle = false;
  DataLoader plain(d, ns);
  ASSERT_TRUE(plain.next(b));
  EXPECT_EQ(doc_heads(b)[0], 100);

  // Resume after k batches gives exactly the remaining batches of the uninterrupted run.
  for (size_t k = 0; k <= full.size(); ++k) {
    DataLoader first(d, o);
    for (size_t i = 0; i < k; ++i) {
      ASSERT_TRUE(first.next(b));
    }
    const LoaderPosition p = first.position();
    DataLoader resumed(d, o);
    resumed.restore(p);
    const auto rest = drain(resumed);
    ASSERT_EQ(rest.size(), full.size() - k) << k;
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), full.begin() + k)) << k;
  }
  // A position at the very end of an epoch resumes into the next one.
  DataLoader end_of_epoch(d, o);
  end_of_epoch.restore({0, static_cast<int64_t>(lengths.size())});
  EXPECT_EQ(drain(end_of_epoch).size(), static_cast<size_t>(batches_in_epoch[1] + batches_in_epoch[2]));
  DataLoader bad(d, o);
  EXPECT_EQ(error_of([&] { bad.restore({0, 24}); }),
            "data loader: cannot restore position epoch 0 cursor 24 (dataset has 23 examples)");
}

}  // namespace
}  // namespace mt
