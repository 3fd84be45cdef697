// mixtune inspect DIR: what a checkpoint is and what training it costs in memory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "io/checkpoint_files.h"
#include "io/hf_cache.h"
#include "models/lora_adapter.h"
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

// The layers using each configuration of `kind` (spec index -> layers), for configurations some layer uses.
std::map<int, std::vector<int64_t>> layers_by_config(const DecoderSpec& c, SublayerKind kind) {
  std::map<int, std::vector<int64_t>> r;
  for (int64_t l = 0; l < c.num_layers(); ++l)
    for (const Sublayer& s : c.layers[static_cast<size_t>(l)].sublayers)
      if (s.kind == kind && (r[s.index].empty() || r[s.index].back() != l)) r[s.index].push_back(l);
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

const char* router_name(const RouterSpec& r) {
  switch (r.score) {
    case RouterScore::softmax_topk: return "softmax_topk";
    case RouterScore::topk_softmax: return "topk_softmax";
    case RouterScore::sigmoid_group: return "sigmoid_group";
  }
  return "unknown";
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

std::string quant_name(const CheckpointQuant& q) {
  switch (q.method) {
    case CheckpointQuant::Method::none: return "none";
    case CheckpointQuant::Method::fp8_block: return fmt::format("fp8 e4m3, {}x{} blocks", q.block_rows, q.block_cols);
    case CheckpointQuant::Method::mxfp4: return "mxfp4";
  }
  return "unknown";
}

struct InspectLora {
  int64_t r = 16;
  double alpha = 32;
  std::vector<std::string> target;  // empty: no LoRA lines
};

void run_inspect(const std::string& path, bool as_json, const InspectLora& lora_args) {
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
  // Layers by what they hold: MoE, a dense MLP, a Mamba2 mixer, attention with no feed-forward (Nemotron-H's one
  // sublayer per layer).
  int64_t moe_layers = 0, dense_layers = 0, mamba2_layers = 0, attention_only = 0;
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    moe_layers += c.is_moe_layer(l);
    dense_layers += c.mlp_of(l) != nullptr;
    mamba2_layers += c.mamba2_of(l) != nullptr;
    attention_only += c.attention_of(l) && !c.moe_of(l) && !c.mlp_of(l);
  }
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
      {"dense_layers", dense_layers},
      {"mamba2_layers", mamba2_layers},
      {"attention_only_layers", attention_only},
      {"hidden_size", c.hidden_size},
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
  // One entry per configuration the layers use, with those layers.
  const auto attention_layers = layers_by_config(c, SublayerKind::attention);
  const auto moe_layers_of = layers_by_config(c, SublayerKind::moe);
  j["attention"] = nlohmann::json::array();
  for (const auto& [i, layers] : attention_layers) {
    const AttentionSpec& a = c.attention[static_cast<size_t>(i)];
    nlohmann::json e = {{"layers", layers},
                        {"kind", a.kind == AttentionKind::mla ? "mla" : "gqa"},
                        {"heads", a.heads},
                        {"kv_heads", a.kv_heads},
                        {"head_dim", a.head_dim},
                        {"v_head_dim", a.value_dim()},
                        {"sliding_window", a.sliding_window}};
    if (a.kind == AttentionKind::mla) {
      e["q_lora_rank"] = a.q_lora_rank;
      e["kv_lora_rank"] = a.kv_lora_rank;
      e["qk_rope_head_dim"] = a.qk_rope_head_dim;
    }
    j["attention"].push_back(e);
  }
  j["moe"] = nlohmann::json::array();
  for (const auto& [i, layers] : moe_layers_of) {
    const MoeSpec& m = c.moe[static_cast<size_t>(i)];
    j["moe"].push_back({{"layers", layers},
                        {"experts", m.num_experts},
                        {"experts_per_token", m.experts_per_token},
                        {"expert_intermediate_size", m.expert.intermediate_size},
                        {"router", router_name(m.router)},
                        {"norm_topk_prob", m.router.norm_topk_prob},
                        {"shared_expert_intermediate_size", m.shared_expert ? m.shared_expert->intermediate_size : 0}});
  }
  const auto mamba2_layers_of = layers_by_config(c, SublayerKind::mamba2);
  j["mamba2"] = nlohmann::json::array();
  for (const auto& [i, layers] : mamba2_layers_of) {
    const Mamba2Spec& m = c.mamba2[static_cast<size_t>(i)];
    j["mamba2"].push_back({{"layers", layers},
                           {"heads", m.heads},
                           {"head_dim", m.head_dim},
                           {"state", m.state},
                           {"groups", m.groups},
                           {"conv_kernel", m.conv_kernel},
                           {"chunk", m.chunk}});
  }
  j["stored_quantisation"] = quant_name(c.quant);
  // LoRA on this model (--lora-target): the adapter's size and the training state with the base frozen.
  int64_t lora_params = 0, lora_full = 0;
  if (!lora_args.target.empty()) {
    LoraConfig lc;
    lc.r = lora_args.r;
    lc.alpha = lora_args.alpha;
    lc.target = lora_args.target;
    const LoraTable t = lora_table_of(c, lc, "--lora-target");
    lora_params = lora_parameter_count(t);
    const ParamTable base = param_table_of(c);
    for (const std::string& n : t.full) lora_full += shape_numel(base.find(n)->shape);
    // Frozen base: its parameters only. Adapter (fp32): itself, gradients, two moments; full-trained parameters
    // as in full training.
    const double adapter_bytes = static_cast<double>(lora_params) * 16;
    const double full_bytes = static_cast<double>(lora_full) * (4 + 8 + (c.dtype == DType::F32 ? 0 : 4));
    j["lora"] = {{"r", lc.r},
                 {"alpha", lc.alpha},
                 {"target", lc.target},
                 {"adapter_parameters", lora_params},
                 {"full_trained_parameters", lora_full},
                 {"training_state_bytes",
                  {{"base_parameters_frozen", param_bytes},
                   {"adapter_fp32_with_gradients_and_moments", adapter_bytes},
                   {"full_trained_gradients_moments_master", full_bytes},
                   {"total_without_activations", param_bytes + adapter_bytes + full_bytes}}}};
  }
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
  fmt::print("  parameters     {} total, {} active per token ({} in routed experts)\n", count(p.total),
             count(p.active), count(p.experts));
  std::string dts;
  for (const auto& [k, v] : dtype_counts) dts += fmt::format("{}{} x{}", dts.empty() ? "" : ", ", k, v);
  fmt::print("  checkpoint     {} shard(s), {} of tensors, dtypes: {}\n", shards, gib(file_bytes),
             dts.empty() ? "(no weights)" : dts);
  if (c.quant.method != CheckpointQuant::Method::none)
    fmt::print("  quantised      {} (dequantised to {} on load; convert writes the float model)\n",
               quant_name(c.quant), dtype_torch_name(c.dtype));
  fmt::print("  training state (AdamW, before activations), parameters stored as {}:\n", dtype_torch_name(c.dtype));
  fmt::print("    parameters        {}\n", gib(param_bytes));
  fmt::print("    gradients (fp32)  {}\n", gib(grad_bytes));
  fmt::print("    AdamW moments     {}\n", gib(moments_bytes));
  fmt::print("    master weights    {}\n", gib(master_bytes));
  fmt::print("    total             {}\n", gib(param_bytes + grad_bytes + moments_bytes + master_bytes));
  if (j.contains("lora")) {
    const auto& l = j["lora"];
    fmt::print("  LoRA r {} on {}: {} adapter parameters{}\n", lora_args.r, fmt::join(lora_args.target, ", "),
               count(lora_params), lora_full ? fmt::format(" + {} trained in full", count(lora_full)) : std::string());
    fmt::print("    base (frozen)     {}\n", gib(l["training_state_bytes"]["base_parameters_frozen"].get<double>()));
    fmt::print("    adapter state     {} (fp32: the adapter, its gradients and AdamW moments)\n",
               gib(l["training_state_bytes"]["adapter_fp32_with_gradients_and_moments"].get<double>()));
    if (lora_full)
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
  static InspectLora lora;
  cmd->add_option("--lora-target", lora.target, "LoRA targets (the family's names, e.g. q_proj,experts): print the "
                  "adapter's size and training state")->delimiter(',');
  cmd->add_option("--lora-r", lora.r, "LoRA rank for --lora-target (default 16)");
  cmd->callback([] { run_inspect(path, as_json, lora); });
}

}  // namespace mt::cli
