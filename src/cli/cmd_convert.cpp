// mixtune convert: rewrite a checkpoint (dtype, shard size) through the engine's own load/save path. A fine-grained
// FP8 checkpoint is dequantised on load, so convert writes the float model without quantization_config.
#include <fmt/format.h>

#include "cli/commands.h"
#include "io/checkpoint_files.h"
#include "models/causal_lm.h"

namespace mt::cli {

namespace {
struct ConvertArgs {
  std::string in, out, dtype, max_shard_size;
};

void run_convert(const ConvertArgs& a) {
  LoadOptions lo;
  if (!a.dtype.empty()) lo.dtype = parse_param_dtype(a.dtype, "--dtype");
  CausalLM m = CausalLM::from_pretrained(a.in, lo);
  SaveOptions so;
  if (!a.max_shard_size.empty()) so.max_shard_bytes = parse_size_bytes(a.max_shard_size);
  m.save_pretrained(a.out, so);
  fmt::print("wrote {} ({}, {} parameters)\n", a.out, dtype_torch_name(m.dtype), m.weights.parameter_count());
}
}  // namespace

void add_convert_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Rewrite a checkpoint in Hugging Face format (dtype, sharding; dequantises FP8)");
  static ConvertArgs a;
  cmd->add_option("--in", a.in, "source checkpoint directory or Org/Name")->required();
  cmd->add_option("--out", a.out, "output directory (written atomically)")->required();
  cmd->add_option("--dtype", a.dtype, "bfloat16 | float32 (default: keep)");
  cmd->add_option("--max-shard-size", a.max_shard_size, "e.g. 5GB, 500MB (default: keep the source sharding)");
  cmd->callback([] { run_convert(a); });
}

}  // namespace mt::cli
