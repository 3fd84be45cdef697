// mixtune inspect DIR: what a checkpoint is and what training it costs in memory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "models/checkpoint_report.h"
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

// "0-3, 8, 10-11": the layers listed, consecutive runs joined.
std::string layer_ranges(const std::vector<int64_t>& layers) {
  std::string r;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    r += (r.empty() ? "" : ", ") + (j == i ? std::to_string(layers[i]) : fmt::format("{}-{}", layers[i], layers[j]));
    i = j + 1;
  }
  return r;
}

std::string attention_desc(const AttentionSpec& a) {
  std::string d = a.kind == AttentionKind::mla
                      ? fmt::format("MLA, {} heads, q_lora_rank {}, kv_lora_rank {}, qk dims {}+{}, v_head_dim {}",
                                    a.heads, a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim,
                                    a.value_dim())
                      : fmt::format("{} heads / {} kv heads, head_dim {}", a.heads, a.kv_heads, a.head_dim);
  if (a.kind == AttentionKind::gqa && a.value_dim() != a.head_dim) d += fmt::format(", v_head_dim {}", a.value_dim());
  if (a.sliding_window > 0) d += fmt::format(", sliding window {}", a.sliding_window);
  if (a.sinks) d += ", sinks";
  if (a.rope.kind == RopeKind::none) d += ", no RoPE";
  return d;
}

std::string router_desc(const MoeSpec& m) {
  const RouterSpec& r = m.router;
  switch (r.score) {
    case RouterScore::softmax_topk:
      return fmt::format("softmax then top-k{}", r.norm_topk_prob ? ", renormalised" : "");
    case RouterScore::topk_softmax: return fmt::format("top-k of the logits then softmax{}", r.linear_bias ? ", biased" : "");
    case RouterScore::sigmoid_group:
      return fmt::format("sigmoid + selection bias, top-k from the best {} of {} expert groups{}, weights x {}",
                         r.topk_groups, r.groups, r.norm_topk_prob ? ", renormalised" : "", r.scale);
  }
  return "unknown";
}

void run_inspect(const std::string& path, bool as_json, const ReportLora& lora) {
  const CheckpointReport report = checkpoint_report(path, lora);
  const nlohmann::json& j = report.json;
  const DecoderSpec& c = report.spec;
  const std::string& dir = report.dir;
  const ArchitectureInfo& arch = architecture_lookup(c.architecture, dir + "/config.json");
  const auto attention_layers = layers_by_config(c, SublayerKind::attention);
  const auto moe_layers_of = layers_by_config(c, SublayerKind::moe);
  const auto mamba2_layers_of = layers_by_config(c, SublayerKind::mamba2);
  const int64_t moe_layers = j["moe_layers"], dense_layers = j["dense_layers"], mamba2_layers = j["mamba2_layers"],
                attention_only = j["attention_only_layers"];
  const nlohmann::json& params = j["parameters"];
  const int64_t total = params["total"], active = params["active_per_token"], experts = params["routed_experts"];
  const nlohmann::json& state = j["training_state_bytes"];
  if (as_json) {
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{}\n", dir);
  fmt::print("  architecture   {} ({})\n", arch.name, arch.description);
  fmt::print("  layers         {} ({} MoE, {} dense{})\n", c.num_layers(), moe_layers, dense_layers,
             mamba2_layers + attention_only > 0
                 ? fmt::format(", {} Mamba2, {} attention only", mamba2_layers, attention_only)
                 : std::string());
  // One line per configuration; the layers are named when they differ.
  for (const auto& [i, layers] : attention_layers)
    fmt::print("  attention      {}hidden {}, {}\n",
               attention_layers.size() > 1 ? "layers " + layer_ranges(layers) + ": " : "", c.hidden_size,
               attention_desc(c.attention[static_cast<size_t>(i)]));
  for (const auto& [i, layers] : moe_layers_of) {
    const MoeSpec& m = c.moe[static_cast<size_t>(i)];
    fmt::print("  experts        {}{} per MoE layer, top-{}, expert intermediate {}{}, router: {}\n",
               moe_layers_of.size() > 1 ? "layers " + layer_ranges(layers) + ": " : "", m.num_experts,
               m.experts_per_token, m.expert.intermediate_size,
               m.shared_expert ? fmt::format(", shared expert intermediate {}", m.shared_expert->intermediate_size)
                               : std::string(),
               router_desc(m));
  }
  for (const auto& [i, layers] : mamba2_layers_of) {
    const Mamba2Spec& m = c.mamba2[static_cast<size_t>(i)];
    fmt::print("  mamba2         layers {}: {} heads x {}, state {}, {} group(s), conv {}, chunk {}\n",
               layer_ranges(layers), m.heads, m.head_dim, m.state, m.groups, m.conv_kernel, m.chunk);
  }
  fmt::print("  vocabulary     {} ({} embeddings)\n", c.vocab_size, c.tie_word_embeddings ? "tied" : "untied");
  fmt::print("  parameters     {} total, {} active per token ({} in routed experts)\n", count(total),
             count(active), count(experts));
  std::string dts;
  for (const auto& [k, v] : j["checkpoint"]["tensor_dtypes"].items()) dts += fmt::format("{}{} x{}", dts.empty() ? "" : ", ", k, v.get<int64_t>());
  fmt::print("  checkpoint     {} shard(s), {} of tensors, dtypes: {}\n", j["checkpoint"]["shards"].get<int64_t>(),
             gib(j["checkpoint"]["tensor_bytes"].get<double>()),
             dts.empty() ? "(no weights)" : dts);
  if (c.quant.method != CheckpointQuant::Method::none)
    fmt::print("  quantised      {} (dequantised to {} on load; convert writes the float model)\n",
               j["stored_quantisation"].get<std::string>(), dtype_torch_name(c.dtype));
  fmt::print("  training state (AdamW, before activations), parameters stored as {}:\n", dtype_torch_name(c.dtype));
  fmt::print("    parameters        {}\n", gib(state["parameters"].get<double>()));
  fmt::print("    gradients (fp32)  {}\n", gib(state["gradients_fp32"].get<double>()));
  fmt::print("    AdamW moments     {}\n", gib(state["adamw_moments_fp32"].get<double>()));
  fmt::print("    master weights    {}\n", gib(state["master_weights_fp32"].get<double>()));
  fmt::print("    total             {}\n", gib(state["total_without_activations"].get<double>()));
  if (j.contains("lora")) {
    const auto& l = j["lora"];
    fmt::print("  LoRA r {} on {}: {} adapter parameters{}\n", lora.r, fmt::join(lora.target, ", "),
               count(l["adapter_parameters"].get<int64_t>()),
               l["full_trained_parameters"].get<int64_t>() > 0
                   ? fmt::format(" + {} trained in full", count(l["full_trained_parameters"].get<int64_t>()))
                   : std::string());
    fmt::print("    base (frozen)     {}\n", gib(l["training_state_bytes"]["base_parameters_frozen"].get<double>()));
    fmt::print("    adapter state     {} (fp32: the adapter, its gradients and AdamW moments)\n",
               gib(l["training_state_bytes"]["adapter_fp32_with_gradients_and_moments"].get<double>()));
    if (l["full_trained_parameters"].get<int64_t>() > 0)
      fmt::print("    trained in full   {} (gradients, moments, master)\n",
                 gib(l["training_state_bytes"]["full_trained_gradients_moments_master"].get<double>()));
    fmt::print("    total             {}\n", gib(l["training_state_bytes"]["total_without_activations"].get<double>()));
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Describe a checkpoint: architecture, parameters, dtypes, memory");
  static std::string path;
  static bool as_json = false;
  cmd->add_option("DIR", path, "checkpoint directory or Org/Name in the local HF cache")->required();
  cmd->add_flag("--json", as_json, "print JSON");
  static ReportLora lora;
  cmd->add_option("--lora-target", lora.target, "LoRA targets (the family's names, e.g. q_proj,experts): print the "
                  "adapter's size and training state")->delimiter(',');
  cmd->add_option("--lora-r", lora.r, "LoRA rank for --lora-target (default 16)");
  cmd->callback([] { run_inspect(path, as_json, lora); });
}

}  // namespace mt::cli
