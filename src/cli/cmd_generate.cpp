// mixtune generate --model DIR (--prompt S | --chat MESSAGES.json) [--max-new-tokens N] [--temperature T]
//   [--top-p P] [--top-k K] [--seed S] [--tokenizer DIR] [--no-thinking] [--json]
// Text generation with a KV cache on the CPU reference backend. --prompt is raw text (no template);
// --chat renders an OpenAI-style messages array with the checkpoint's chat template (chat_template.jinja or
// tokenizer_config.json beside the tokenizer; the built-in Qwen3 template when it has none), with
// add_generation_prompt.
// Sampling defaults come from the checkpoint's generation_config.json. The text is streamed to stdout
// as it is generated, or printed as one JSON object with --json.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "data/chat_prompt.h"
#include "data/tokenizer.h"
#include "io/json_text.h"
#include "models/causal_lm.h"
#include "models/generation_config.h"
#include "models/generate.h"
#include "models/lora_checkpoint.h"

namespace mt::cli {

namespace {

struct GenerateArgs {
  std::string model, prompt, chat, tokenizer, adapter;
  int64_t max_new_tokens = 128;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  uint64_t seed = 0;
  bool no_thinking = false;
  bool json = false;
};

constexpr size_t kMaxMessagesBytes = 64 << 20;

std::string read_messages_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("--chat {}: cannot open the messages file", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("--chat {}: cannot read the messages file", path);
  std::string text = ss.str();
  if (text.size() > kMaxMessagesBytes)
    fail("--chat {}: file is too large (expected at most {} bytes, found {})", path, kMaxMessagesBytes, text.size());
  return text;
}

// The rendered chat prompt of --chat through the chat template of `template_dir` (the tokenizer's directory, where
// Transformers reads it from).
std::string chat_prompt(const GenerateArgs& a, const std::string& template_dir) {
  const std::string what = "--chat " + a.chat;
  return chat_prompt_render(json_parse_strict(read_messages_file(a.chat), what, 64), template_dir, !a.no_thinking,
                            what);
}

// Sampling options: the command line, else generation_config.json, else HF's defaults (1.0, 1.0, off).
// generation_config's do_sample = false (stated, not defaulted) makes the default greedy, as in HF.
SamplingOptions sampling_options(const GenerateArgs& a, const GenerationConfig& gc) {
  SamplingOptions s;
  s.temperature = a.temperature.value_or(gc.do_sample == false ? 0.0 : gc.temperature.value_or(1.0));
  s.top_p = a.top_p.value_or(gc.top_p.value_or(1.0));
  s.top_k = a.top_k.value_or(gc.top_k.value_or(0));
  sampling_options_check(s);
  return s;
}

bool ends_incomplete(const std::string& s) {
  // Decoding stops mid-character when a byte-level token ends inside a UTF-8 sequence: the tail then
  // decodes to U+FFFD (EF BF BD) until the next token completes it.
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

void run_generate(const GenerateArgs& a) {
  // Check what the user typed before loading anything large.
  SamplingOptions typed;
  typed.temperature = a.temperature.value_or(1.0);
  typed.top_p = a.top_p.value_or(1.0);
  typed.top_k = a.top_k.value_or(0);
  sampling_options_check(typed);
  if (a.max_new_tokens < 0) fail("--max-new-tokens must be >= 0, found {}", a.max_new_tokens);

  CausalLM m = CausalLM::from_pretrained(a.model);
  // Generation runs the adapter merged into the loaded weights (PEFT's merge_and_unload; the KV-cache path has no
  // unmerged LoRA): equal to the unmerged forward up to rounding (docs/lora.md).
  if (!a.adapter.empty()) lora_merge_into(m.weights, lora_load_pretrained(a.adapter, m.config, m.weights));
  const GenerationConfig gc = generation_config_read(m.source_dir, m.config.raw);
  const std::string tok_dir = a.tokenizer.empty() ? m.source_dir : a.tokenizer;
  const Tokenizer tok = Tokenizer::from_file(tok_dir);
  const std::filesystem::path tok_path(tok_dir);
  const std::string text =
      a.chat.empty() ? a.prompt
                     : chat_prompt(a, std::filesystem::is_directory(tok_path) ? tok_dir : tok_path.parent_path().string());
  std::vector<int64_t> prompt;
  for (int32_t id : tok.encode(text)) prompt.push_back(id);
  if (prompt.empty()) fail("{}: the prompt encodes to no tokens", a.chat.empty() ? "--prompt" : "--chat " + a.chat);
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] >= m.config.vocab_size)
      fail("the prompt's token {} has id {}, outside the model vocabulary [0, {}) (tokenizer and model differ?)", i,
           prompt[i], m.config.vocab_size);

  GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.sampling = sampling_options(a, gc);
  o.seed = a.seed;
  o.eos_token_ids = gc.eos_token_ids;
  auto is_eos = [&](int64_t id) {
    return std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), id) != o.eos_token_ids.end();
  };

  // Streaming: after each token, print what its decoding added to the text (ids that name no token
  // decode to ""). Held back while the text ends mid-character or no longer extends what was printed.
  std::vector<int32_t> shown;
  std::string printed;
  auto stream = [&](int64_t id) {
    if (is_eos(id)) return;
    shown.push_back(static_cast<int32_t>(id));
    const std::string decoded = tok.decode(shown);
    if (ends_incomplete(decoded) || decoded.compare(0, printed.size(), printed) != 0) return;
    std::fwrite(decoded.data() + printed.size(), 1, decoded.size() - printed.size(), stdout);
    std::fflush(stdout);
    printed = decoded;
  };
  GenerateResult r = generate(m.config, m.weights, prompt, o, a.json ? std::function<void(int64_t)>() : stream);

  // The text leaves out the EOS that stopped generation.
  std::vector<int32_t> out_ids(r.ids.begin(), r.ids.end() - (r.stop_reason == "eos" ? 1 : 0));
  const std::string out_text = tok.decode(out_ids);
  if (!a.json) {
    if (out_text.compare(0, printed.size(), printed) == 0)
      std::fwrite(out_text.data() + printed.size(), 1, out_text.size() - printed.size(), stdout);
    std::fputc('\n', stdout);
    return;
  }
  const double secs = r.prefill_seconds + r.decode_seconds;
  nlohmann::json j = {{"prompt_tokens", prompt.size()},
                      {"generated_ids", r.ids},
                      {"text", out_text},
                      {"stop_reason", r.stop_reason},
                      {"tokens_per_s", secs > 0 ? static_cast<double>(r.ids.size()) / secs : 0.0}};
  const std::string s = j.dump();
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text with a KV cache (CPU reference backend)");
  cmd->add_option("--model", a->model, "checkpoint directory or Org/Name in the local HF cache")->required();
  auto* prompt = cmd->add_option("--prompt", a->prompt, "raw text to continue (encoded as is, no chat template)");
  auto* chat = cmd->add_option("--chat", a->chat,
                               "JSON file with an OpenAI-style messages array (the model's chat template, else Qwen3's)");
  prompt->excludes(chat);
  chat->excludes(prompt);
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "most tokens to generate (default 128)");
  cmd->add_option("--temperature", a->temperature, "0 = greedy (default: generation_config.json's, else 1.0)");
  cmd->add_option("--top-p", a->top_p, "nucleus sampling mass in (0, 1] (default: generation_config.json's, else 1)");
  cmd->add_option("--top-k", a->top_k, "keep the k most likely tokens, 0 = off (default: generation_config.json's)");
  cmd->add_option("--seed", a->seed, "random seed of the sampler (default 0)");
  cmd->add_option("--tokenizer", a->tokenizer, "directory with tokenizer.json (default: the model directory)");
  cmd->add_option("--adapter", a->adapter, "a LoRA adapter directory in PEFT's format (merged into the weights)");
  cmd->add_flag("--no-thinking", a->no_thinking, "render --chat with enable_thinking=false")->needs(chat);
  cmd->add_flag("--json", a->json, "print one JSON object: prompt_tokens, generated_ids, text, stop_reason, tokens_per_s");
  cmd->callback([a, prompt, chat] {
    if (prompt->count() == 0 && chat->count() == 0) fail("generate: give --prompt TEXT or --chat MESSAGES.json");
    run_generate(*a);
  });
}

}  // namespace mt::cli
