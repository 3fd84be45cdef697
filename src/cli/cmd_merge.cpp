// mixtune merge --model BASE --adapter DIR --out DIR: the base with a LoRA adapter merged in (PEFT's
// merge_and_unload: W + s·B·A, full-trained tensors replaced), written by the same save path as every mixtune
// checkpoint (CausalLM::save_pretrained: Transformers' layout, the base's shard mapping and dtype, carried files).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "models/causal_lm.h"
#include "models/lora_checkpoint.h"

namespace mt::cli {

namespace {
struct MergeArgs {
  std::string model, adapter, out;
};

void run_merge(const MergeArgs& a) {
  CausalLM m = CausalLM::from_pretrained(a.model);  // the checkpoint's own dtype
  const LoraWeights adapter = lora_load_pretrained(a.adapter, m.config, m.weights);
  lora_merge_into(m.weights, adapter);
  m.save_pretrained(a.out);
  const LoraConfig& c = adapter.table->config;
  fmt::print("wrote {} ({}, r {} alpha {} on {} merged)\n", a.out, dtype_torch_name(m.dtype), c.r, c.alpha,
             fmt::join(c.target, ", "));
}
}  // namespace

void add_merge_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("merge", "Merge a LoRA adapter (PEFT format) into its base: a plain checkpoint");
  static MergeArgs a;
  cmd->add_option("--model", a.model, "base checkpoint directory or Org/Name in the local HF cache")->required();
  cmd->add_option("--adapter", a.adapter, "adapter directory (adapter_config.json + adapter_model.safetensors)")
      ->required();
  cmd->add_option("--out", a.out, "output directory (written atomically)")->required();
  cmd->callback([] { run_merge(a); });
}

}  // namespace mt::cli
