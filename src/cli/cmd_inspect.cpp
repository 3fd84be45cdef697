// mixtune inspect DIR: what a checkpoint is and what training it costs in memory.
#include <fmt/format.h>

#include <filesystem>
#include <map>

#include "cli/commands.h"
#include "io/checkpoint_files.h"
#include "io/hf_cache.h"
#include "models/model_weights.h"
#include "models/registry.h"
#include "models/spec/decoder_spec.h"

namespace mt::cli {

namespace {

std::string gib(double bytes) {
  if (bytes < 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0));
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

// 30.53 B, 3.04 B, 56.6 K: counts in the unit people quote them in.
std::string count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f} K", n / 1e3);
  return std::to_string(n);
}

void run_inspect(const std::string& path, bool as_json) {
  const std::string dir = hf_resolve_model_path(path);
  const std::string cfg_path = (std::filesystem::path(dir) / "config.json").string();
  DecoderSpec c = DecoderSpec::from_file(cfg_path);
  const ArchitectureInfo& arch = architecture_lookup(c.architecture, cfg_path);
  std::map<std::string, int64_t> dtype_counts;
  int64_t file_bytes = 0;
  size_t shards = 0;
  bool have_weights = std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors") ||
                      std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors.index.json");
  if (have_weights) {
    CheckpointFiles files = CheckpointFiles::open(dir);
    shards = files.shard_files().size();
    for (const auto& n : files.names()) {
      const auto& info = files.info(n);
      dtype_counts[std::string(dtype_torch_name(info.dtype))] += 1;
      file_bytes += static_cast<int64_t>(info.end - info.begin);
    }
  }
  const ParamCounts p = param_counts(param_table_of(c));
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers(); ++l) moe_layers += c.is_moe_layer(l);
  const double param_bytes = static_cast<double>(p.total) * static_cast<double>(dtype_size(c.dtype));
  const double grad_bytes = static_cast<double>(p.total) * 4;
  const double moments_bytes = static_cast<double>(p.total) * 8;
  const double master_bytes = c.dtype == DType::F32 ? 0.0 : static_cast<double>(p.total) * 4;
  nlohmann::json j = {
      {"path", dir},
      {"architecture", arch.name},
      {"model_type", c.model_type},
      {"dtype", std::string(dtype_torch_name(c.dtype))},
      {"layers", c.num_layers()},
      {"moe_layers", moe_layers},
      {"dense_layers", c.num_layers() - moe_layers},
      {"hidden_size", c.hidden_size},
      {"heads", c.only_attention().heads},
      {"kv_heads", c.only_attention().kv_heads},
      {"head_dim", c.only_attention().head_dim},
      {"experts", c.num_experts()},
      {"experts_per_token", c.experts_per_token()},
      {"vocab_size", c.vocab_size},
      {"tied_embeddings", c.tie_word_embeddings},
      {"parameters", {{"total", p.total}, {"active_per_token", p.active}, {"routed_experts", p.experts},
                      {"embeddings", p.embedding}}},
      {"checkpoint", {{"shards", shards}, {"tensor_bytes", file_bytes}, {"tensor_dtypes", dtype_counts}}},
      {"training_state_bytes",
       {{"parameters", param_bytes},
        {"gradients_fp32", grad_bytes},
        {"adamw_moments_fp32", moments_bytes},
        {"master_weights_fp32", master_bytes},
        {"total_without_activations", param_bytes + grad_bytes + moments_bytes + master_bytes}}},
  };
  if (as_json) {
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{}\n", dir);
  fmt::print("  architecture   {} ({})\n", arch.name, arch.description);
  fmt::print("  layers         {} ({} MoE, {} dense)\n", c.num_layers(), moe_layers,
             c.num_layers() - moe_layers);
  fmt::print("  attention      hidden {}, {} heads / {} kv heads, head_dim {}\n", c.hidden_size,
             c.only_attention().heads, c.only_attention().kv_heads, c.only_attention().head_dim);
  if (c.num_experts() > 0)
    fmt::print("  experts        {} per MoE layer, top-{}, expert intermediate {}, renormalised top-k: {}\n",
               c.num_experts(), c.experts_per_token(), c.only_moe().expert.intermediate_size,
               c.only_moe().router.norm_topk_prob ? "yes" : "no");
  fmt::print("  vocabulary     {} ({} embeddings)\n", c.vocab_size, c.tie_word_embeddings ? "tied" : "untied");
  fmt::print("  parameters     {} total, {} active per token ({} in routed experts)\n", count(p.total),
             count(p.active), count(p.experts));
  std::string dts;
  for (const auto& [k, v] : dtype_counts) dts += fmt::format("{}{} x{}", dts.empty() ? "" : ", ", k, v);
  fmt::print("  checkpoint     {} shard(s), {} of tensors, dtypes: {}\n", shards, gib(file_bytes),
             dts.empty() ? "(no weights)" : dts);
  fmt::print("  training state (AdamW, before activations), parameters stored as {}:\n", dtype_torch_name(c.dtype));
  fmt::print("    parameters        {}\n", gib(param_bytes));
  fmt::print("    gradients (fp32)  {}\n", gib(grad_bytes));
  fmt::print("    AdamW moments     {}\n", gib(moments_bytes));
  fmt::print("    master weights    {}\n", gib(master_bytes));
  fmt::print("    total             {}\n", gib(param_bytes + grad_bytes + moments_bytes + master_bytes));
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Describe a checkpoint: architecture, parameters, dtypes, memory");
  static std::string path;
  static bool as_json = false;
  cmd->add_option("DIR", path, "checkpoint directory or Org/Name in the local HF cache")->required();
  cmd->add_flag("--json", as_json, "print JSON");
  cmd->callback([] { run_inspect(path, as_json); });
}

}  // namespace mt::cli
