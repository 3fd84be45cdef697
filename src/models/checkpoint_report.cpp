#include "models/checkpoint_report.h"

#include <fmt/format.h>

#include <filesystem>

#include "io/checkpoint_files.h"
#include "io/hf_cache.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"
#include "models/registry.h"

namespace mt {

namespace {

const char* router_name(const RouterSpec& r) {
  switch (r.score) {
    case RouterScore::softmax_topk: return "softmax_topk";
    case RouterScore::topk_softmax: return "topk_softmax";
    case RouterScore::sigmoid_group: return "sigmoid_group";
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

}  // namespace

std::map<int, std::vector<int64_t>> layers_by_config(const DecoderSpec& c, SublayerKind kind) {
  std::map<int, std::vector<int64_t>> r;
  for (int64_t l = 0; l < c.num_layers(); ++l)
    for (const Sublayer& s : c.layers[static_cast<size_t>(l)].sublayers)
      if (s.kind == kind && (r[s.index].empty() || r[s.index].back() != l)) r[s.index].push_back(l);
  return r;
}

CheckpointReport checkpoint_report(const std::string& path, const ReportLora& lora) {
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
  if (!lora.target.empty()) {
    LoraConfig lc;
    lc.r = lora.r;
    lc.alpha = lora.alpha;
    lc.target = lora.target;
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
  return CheckpointReport{dir, std::move(c), std::move(j)};
}

}  // namespace mt
