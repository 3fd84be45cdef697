// mixtune init: a randomly initialised checkpoint from a config.json or a named preset.
#include <fmt/format.h>

#include <fstream>

#include "cli/commands.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "models/spec/config_writer.h"
#include "models/causal_lm.h"
#include "models/presets.h"

namespace mt::cli {

namespace {
struct InitArgs {
  std::string config_file, preset, out, dtype, tokenizer;
  uint64_t seed = 1234;
  int64_t layers = 0;
};

void run_init(const InitArgs& a) {
  nlohmann::json j;
  std::string source;
  if (!a.config_file.empty()) {
    std::ifstream f(a.config_file);
    if (!f) fail("{}: cannot open", a.config_file);
    j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded()) fail("{}: not valid JSON", a.config_file);
    source = a.config_file;
  } else {
    j = preset_config_json(a.preset);
    source = "preset " + a.preset;
  }
  if (a.layers > 0) config_json_set_layers(j, a.layers);
  DecoderSpec cfg = DecoderSpec::from_json(j, source);
  DType dtype = a.dtype.empty() ? cfg.dtype : parse_param_dtype(a.dtype, "--dtype");
  if (dtype != DType::F32 && dtype != DType::BF16) dtype = DType::F32;
  CausalLM m = CausalLM::from_config(cfg, dtype, a.seed);
  if (!a.tokenizer.empty()) {
    // The tokenizer files are carried into the checkpoint like any source directory's.
    const std::string tok_file = a.tokenizer + "/tokenizer.json";
    const Tokenizer tok = Tokenizer::from_file(tok_file);
    if (tok.vocab_size() > cfg.vocab_size)
      fail("--tokenizer: {} has {} tokens but the model's vocab_size is {}", tok_file, tok.vocab_size(),
           cfg.vocab_size);
    m.source_dir = a.tokenizer;
  }
  m.save_pretrained(a.out);
  fmt::print("wrote {} ({} parameters, {}, seed {})\n", a.out, m.weights.parameter_count(),
             dtype_torch_name(dtype), a.seed);
}
}  // namespace

void add_init_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("init", "Write a randomly initialised checkpoint (normal(0, initializer_range))");
  static InitArgs a;
  auto* g = cmd->add_option_group("source");
  g->add_option("--config", a.config_file, "config.json to initialise");
  std::string presets;
  for (const auto& p : preset_list()) presets += "\n  " + p.name + ": " + p.description;
  g->add_option("--preset", a.preset, "named shape:" + presets);
  g->require_option(1);
  cmd->add_option("OUT", a.out, "output directory")->required();
  cmd->add_option("--seed", a.seed, "random seed");
  cmd->add_option("--dtype", a.dtype, "parameter dtype: bfloat16 | float32 (default: the config's)");
  cmd->add_option("--layers", a.layers, "override num_hidden_layers");
  cmd->add_option("--tokenizer", a.tokenizer, "directory whose tokenizer files are copied into OUT");
  cmd->callback([] { run_init(a); });
}

DType parse_param_dtype(const std::string& s, const char* option) {
  auto t = dtype_from_torch_name(s);
  if (!t || (*t != DType::F32 && *t != DType::BF16))
    fail("{}: bad dtype '{}' (valid: bfloat16, float32)", option, s);
  return *t;
}

}  // namespace mt::cli
