// `mixtune generate` end to end on a small random model (init --preset qwen3-moe-test) with a hand-built
// byte-level tokenizer: the CLI's greedy ids equal the library's generate(), streamed text equals the --json
// text, seeds reproduce, --chat renders the model's chat template (Qwen3's when it has none),
// generation_config.json supplies defaults and EOS,
// and bad input is one line naming the option, file or field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "models/causal_lm.h"
#include "models/generate.h"
#include "models/lora_checkpoint.h"
#include "../models/lora_test_util.h"
#include "cli_process.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using mt::test::RunResult;
RunResult run(const std::string& args) { return mt::test::run_capture(args); }

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2 byte-level vocabulary (token id = byte value) plus the ChatML control tokens, no merges.
json byte_tokenizer() {
  json vocab = json::object();
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    vocab[utf8(printable ? b : next++)] = b;
  }
  json added = json::array();
  int id = 256;
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"}) {
    const bool special = std::string(t).find('|') != std::string::npos;
    added.push_back({{"id", id++}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", special}});
  }
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
            {"ignore_merges", false}, {"vocab", vocab}, {"merges", json::array()}}}};
}

class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir = new fs::path(fs::temp_directory_path() / ("mt_gen_cli_" + std::to_string(::getpid())));
    fs::remove_all(*dir);
    fs::create_directories(*dir);
    model = *dir / "model";
    const RunResult r = run("init --preset qwen3-moe-test --seed 4 " + model.string());
    ASSERT_EQ(r.code, 0) << r.err;
    write(model / "tokenizer.json", byte_tokenizer().dump());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir);
    delete dir;
  }
  static std::string m() { return "generate --model " + model.string() + " "; }
  static json run_json(const std::string& args) {
    const RunResult r = run(m() + args + " --json");
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? json::parse(r.out) : json::object();
  }
  static inline fs::path* dir = nullptr;
  static inline fs::path model;
};

void expect_one_line_error(const RunResult& r, const std::string& must_contain) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("mixtune: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(GenerateCli, GreedyEqualsLibraryAndStreamEqualsJsonText) {
  const json j = run_json("--prompt 'Hello world' --max-new-tokens 8 --temperature 0");
  EXPECT_EQ(j["prompt_tokens"], 11);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  CausalLM lm = CausalLM::from_pretrained(model.string());
  const Tokenizer tok = Tokenizer::from_file(model.string());
  std::vector<int64_t> prompt;
  for (int32_t id : tok.encode("Hello world")) prompt.push_back(id);
  GenerateOptions o;
  o.max_new_tokens = 8;
  o.sampling.temperature = 0;
  o.eos_token_ids = {2};
  const GenerateResult want = generate(lm.config, lm.weights, prompt, o);
  EXPECT_EQ(j["generated_ids"].get<std::vector<int64_t>>(), want.ids);
  EXPECT_EQ(j["stop_reason"], want.stop_reason);
  std::vector<int32_t> text_ids(want.ids.begin(), want.ids.end() - (want.stop_reason == "eos" ? 1 : 0));
  EXPECT_EQ(j["text"], tok.decode(text_ids));

  // Sampled: the same seed gives the same tokens; the streamed stdout is the JSON text and a newline.
  const std::string args = "--prompt 'Once upon' --max-new-tokens 24 --temperature 1 --top-k 50 --top-p 0.9 --seed 3";
  const json s1 = run_json(args);
  const json again = run_json(args);
  EXPECT_EQ(again["generated_ids"], s1["generated_ids"]);
  EXPECT_EQ(again["text"], s1["text"]);
  const RunResult plain = run(m() + args);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out, s1["text"].get<std::string>() + "\n");
  const json s2 = run_json("--prompt 'Once upon' --max-new-tokens 24 --temperature 1 --top-k 50 --top-p 0.9 --seed 4");
  EXPECT_NE(s2["generated_ids"], s1["generated_ids"]);
}

TEST_F(GenerateCli, ChatRendersTheQwen3Template) {
  write(*dir / "messages.json", R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}])");
  const Tokenizer tok = Tokenizer::from_file(model.string());
  const auto messages = chat_messages_from_json(
      nlohmann::ordered_json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}])"),
      "test");
  for (bool thinking : {true, false}) {
    SCOPED_TRACE(thinking);
    ChatOptions co;
    co.add_generation_prompt = true;
    co.enable_thinking = thinking;
    const size_t want = tok.encode(chat_render_qwen3(messages, co)).size();
    const json j = run_json("--chat " + (*dir / "messages.json").string() + " --max-new-tokens 2 --temperature 0" +
                            (thinking ? "" : " --no-thinking"));
    EXPECT_EQ(j["prompt_tokens"], want);
  }
  // An object holding "messages" is accepted too.
  write(*dir / "wrapped.json", R"({"messages": [{"role": "user", "content": "Hi!"}]})");
  EXPECT_EQ(run_json("--chat " + (*dir / "wrapped.json").string() + " --max-new-tokens 1")["generated_ids"].size(), 1u);
}

TEST_F(GenerateCli, ChatRendersTheTokenizersOwnTemplate) {
  // A tokenizer directory with its chat_template.jinja: --chat renders it (one byte = one token here).
  const fs::path tok = *dir / "tok_with_template";
  fs::create_directories(tok);
  fs::copy_file(model / "tokenizer.json", tok / "tokenizer.json", fs::copy_options::overwrite_existing);
  write(tok / "chat_template.jinja",
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}");
  write(*dir / "hi.json", R"([{"role": "user", "content": "Hi!"}])");
  const std::string args = "--chat " + (*dir / "hi.json").string() + " --max-new-tokens 1 --temperature 0";
  EXPECT_EQ(run_json(args + " --tokenizer " + tok.string())["prompt_tokens"], std::string("[user] Hi!\n[assistant] ").size());
  // The same through the tokenizer file's path, and through tokenizer_config.json's copy.
  EXPECT_EQ(run_json(args + " --tokenizer " + (tok / "tokenizer.json").string())["prompt_tokens"], 23);
  fs::remove(tok / "chat_template.jinja");
  write(tok / "tokenizer_config.json", R"({"chat_template": "{{ messages[0].content }}"})");
  EXPECT_EQ(run_json(args + " --tokenizer " + tok.string())["prompt_tokens"], 3);
  // A template the interpreter refuses is one line naming it.
  write(tok / "tokenizer_config.json", R"({"chat_template": "{% for m in messages %}"})");
  expect_one_line_error(run(m() + args + " --tokenizer " + tok.string()),
                        tok.string() + " chat template line 1: unexpected end of template, expected '{% endfor %}'");
}

TEST_F(GenerateCli, GenerationConfigGivesDefaultsAndEos) {
  const fs::path m2 = *dir / "model_gc";
  fs::copy(model, m2, fs::copy_options::recursive);
  const std::string base = "generate --model " + m2.string() + " --prompt 'Hello world' --max-new-tokens 6 --json";
  const json greedy = run_json("--prompt 'Hello world' --max-new-tokens 6 --temperature 0");
  // do_sample = false: greedy unless --temperature says otherwise.
  write(m2 / "generation_config.json", R"({"do_sample": false, "eos_token_id": 2})");
  RunResult r = run(base);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["generated_ids"], greedy["generated_ids"]);
  // Every id is an EOS: one token, stop_reason eos, and the EOS is not part of the text.
  json every = json::array();
  for (int i = 0; i < 512; ++i) every.push_back(i);
  write(m2 / "generation_config.json", json{{"eos_token_id", every}, {"temperature", 0.7}}.dump());
  r = run(base);
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["generated_ids"].size(), 1u);
  EXPECT_EQ(j["stop_reason"], "eos");
  EXPECT_EQ(j["text"], "");
  write(m2 / "generation_config.json", R"({"top_p": 2})");
  expect_one_line_error(run(base), "generation_config.json: top_p: expected a number in (0, 1], found 2");
}

TEST_F(GenerateCli, BadInputIsOneLineNamingTheProblem) {
  expect_one_line_error(run(m() + "--prompt hi --temperature -1"), "--temperature");
  expect_one_line_error(run(m() + "--prompt hi --top-p 0"), "--top-p must be in (0, 1], found 0");
  expect_one_line_error(run(m() + "--prompt hi --top-p 1.5"), "--top-p");
  expect_one_line_error(run(m() + "--prompt hi --max-new-tokens -3"), "--max-new-tokens");
  expect_one_line_error(run(m()), "--prompt");
  fs::create_directories(*dir / "no_tokenizer");
  expect_one_line_error(run(m() + "--prompt hi --tokenizer " + (*dir / "no_tokenizer").string()), "tokenizer.json");
  write(*dir / "bad.json", "[{\"role\": \"user\", ");
  expect_one_line_error(run(m() + "--chat " + (*dir / "bad.json").string()), (*dir / "bad.json").string());
  write(*dir / "role.json", R"([{"role": "robot", "content": "x"}])");
  expect_one_line_error(run(m() + "--chat " + (*dir / "role.json").string()), "messages[0].role");
  write(*dir / "empty.json", "[]");
  expect_one_line_error(run(m() + "--chat " + (*dir / "empty.json").string()), "empty");
  expect_one_line_error(run(m() + "--chat " + (*dir / "missing.json").string()), "missing.json");
  expect_one_line_error(run(m() + "--prompt ''"), "--prompt");
  // A prompt longer than max_position_embeddings.
  const fs::path m3 = *dir / "model_short";
  fs::copy(model, m3, fs::copy_options::recursive);
  json c;
  std::ifstream(m3 / "config.json") >> c;
  c["max_position_embeddings"] = 4;
  write(m3 / "config.json", c.dump());
  expect_one_line_error(run("generate --model " + m3.string() + " --prompt 'Hello world'"),
                        "the prompt has 11 tokens, more than max_position_embeddings = 4");
}

// --adapter: generation runs the adapter merged into the loaded weights, so it equals generating from the
// checkpoint `mixtune merge` writes; the adapter changes what is generated.
TEST_F(GenerateCli, AdapterEqualsTheMergedCheckpoint) {
  CausalLM lm = CausalLM::from_pretrained(model.string());
  auto table = std::make_shared<const LoraTable>(
      lora_table_of(lm.config, test::config_of({"q_proj", "o_proj", "experts"}, 4), "t"));
  lora_save_pretrained((*dir / "adapter").string(), lm.config, test::random_adapter(table, lm.config.num_layers(), 8),
                       lm.weights, model.string());
  const RunResult r = run("merge --model " + model.string() + " --adapter " + (*dir / "adapter").string() + " --out " +
                          (*dir / "merged").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string args = "--prompt 'Hello world' --max-new-tokens 12 --temperature 0 --json";
  const RunResult with = run(m() + args + " --adapter " + (*dir / "adapter").string());
  const RunResult merged = run("generate --model " + (*dir / "merged").string() + " " + args);
  ASSERT_EQ(with.code, 0) << with.err;
  ASSERT_EQ(merged.code, 0) << merged.err;
  EXPECT_EQ(json::parse(with.out)["generated_ids"], json::parse(merged.out)["generated_ids"]);
  EXPECT_NE(json::parse(with.out)["generated_ids"], run_json("--prompt 'Hello world' --max-new-tokens 12 --temperature 0")["generated_ids"]);
}

}  // namespace
}  // namespace mt
