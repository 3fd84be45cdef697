// mixtune score: loss of a model on pre-tokenized data, as Transformers computes it.
#include <fmt/format.h>

#include <optional>

#include "cli/commands.h"
#include "core/memory.h"
#include "data/token_jsonl.h"
#include "io/npy.h"
#include "models/causal_lm.h"
#include "models/lora_checkpoint.h"
#include "train/evaluate.h"

namespace mt::cli {

namespace {
struct ScoreArgs {
  std::string model, data, logits, dtype, adapter;
};

void run_score(const ScoreArgs& a) {
  LoadOptions lo;
  if (!a.dtype.empty()) lo.dtype = parse_param_dtype(a.dtype, "--dtype");
  CausalLM m = CausalLM::from_pretrained(a.model, lo);
  auto records = token_jsonl_read(a.data, m.config.vocab_size);
  // The adapter runs unmerged, as PEFT's forward does (its full-trained tensors replace the base's).
  std::optional<LoraWeights> adapter;
  if (!a.adapter.empty()) adapter = lora_load_pretrained(a.adapter, m.config, m.weights);
  ScoreResult r = score_records(m, records, !a.logits.empty(), adapter ? &*adapter : nullptr);
  if (!a.logits.empty()) npy_write_f32(a.logits, r.logits);
  nlohmann::json j = {{"loss", r.loss},
                      {"ce_loss", r.ce_loss},
                      {"aux_loss", r.aux_loss},
                      {"tokens", r.tokens},
                      {"records", records.size()},
                      {"dtype", std::string(dtype_torch_name(m.dtype))},
                      {"peak_host_bytes", memory_stats(Device::cpu()).peak_bytes}};
  fmt::print("{}\n", j.dump());
}
}  // namespace

void add_score_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("score", "Loss of a model on {\"input_ids\",\"labels\"} JSONL, printed as JSON");
  static ScoreArgs a;
  cmd->add_option("--model", a.model, "checkpoint directory or Org/Name in the local HF cache")->required();
  cmd->add_option("--data", a.data, "JSONL file, one {\"input_ids\":[...],\"labels\":[...]} per line")->required();
  cmd->add_option("--logits", a.logits, "write float32 logits to this .npy file");
  cmd->add_option("--dtype", a.dtype, "compute dtype: bfloat16 | float32 (default: the checkpoint's)");
  cmd->add_option("--adapter", a.adapter, "a LoRA adapter directory in PEFT's format, applied unmerged");
  cmd->callback([] { run_score(a); });
}

}  // namespace mt::cli
