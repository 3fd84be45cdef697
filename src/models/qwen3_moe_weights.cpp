#include "models/qwen3_moe_weights.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/float_convert.h"
#include "core/rng.h"

namespace mt {

namespace {

std::string layer_prefix(size_t l) { return fmt::format("model.layers.{}.", l); }

// Calls f(name, tensor) for every parameter of `w`, in Transformers' state_dict order (v5 names).
// Which MLP a layer has is read from which tensors are defined (router => MoE).
template <typename W, typename F>
void parameters_visit(W& w, F&& f) {
  f(std::string("model.embed_tokens.weight"), w.embed);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    auto& L = w.layers[l];
    const std::string p = layer_prefix(l);
    f(p + "self_attn.q_proj.weight", L.q_proj);
    f(p + "self_attn.k_proj.weight", L.k_proj);
    f(p + "self_attn.v_proj.weight", L.v_proj);
    f(p + "self_attn.o_proj.weight", L.o_proj);
    f(p + "self_attn.q_norm.weight", L.q_norm);
    f(p + "self_attn.k_norm.weight", L.k_norm);
    if (L.router.defined()) {
      f(p + "mlp.gate.weight", L.router);
      f(p + "mlp.experts.gate_up_proj", L.experts_gate_up);
      f(p + "mlp.experts.down_proj", L.experts_down);
    } else {
      f(p + "mlp.gate_proj.weight", L.mlp_gate);
      f(p + "mlp.up_proj.weight", L.mlp_up);
      f(p + "mlp.down_proj.weight", L.mlp_down);
    }
    f(p + "input_layernorm.weight", L.input_norm);
    f(p + "post_attention_layernorm.weight", L.post_norm);
  }
  f(std::string("model.norm.weight"), w.final_norm);
  if (w.lm_head.defined()) f(std::string("lm_head.weight"), w.lm_head);
}

bool name_is_norm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

// Every parameter allocated (uninitialised) with the shapes `cfg` implies, or only described (absent).
Qwen3MoeWeights weights_alloc(const Qwen3MoeConfig& cfg, DType dtype, Device device = Device::cpu(),
                              int64_t experts_held = -1, bool absent = false) {
  auto make = [&](const Shape& shape) {
    return absent ? Tensor::absent(shape, dtype, device) : Tensor::empty(shape, dtype, device);
  };
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, D = cfg.head_dim;
  const int64_t nq = cfg.num_attention_heads * D, nkv = cfg.num_key_value_heads * D;
  const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, F = cfg.intermediate_size;
  Qwen3MoeWeights w;
  w.embed = make({V, H});
  w.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    Qwen3MoeLayerWeights& L = w.layers[l];
    L.input_norm = make({H});
    L.q_proj = make({nq, H});
    L.k_proj = make({nkv, H});
    L.v_proj = make({nkv, H});
    L.o_proj = make({H, nq});
    L.q_norm = make({D});
    L.k_norm = make({D});
    L.post_norm = make({H});
    if (cfg.is_moe_layer(static_cast<int64_t>(l))) {
      L.router = make({E, H});
      const int64_t held = experts_held >= 0 ? experts_held : E;
      L.experts_gate_up = make({held, 2 * I, H});
      L.experts_down = make({held, H, I});
    } else {
      L.mlp_gate = make({F, H});
      L.mlp_up = make({F, H});
      L.mlp_down = make({H, F});
    }
  }
  w.final_norm = make({H});
  if (!cfg.tie_word_embeddings) w.lm_head = make({V, H});
  return w;
}

void check_param_dtype(DType dtype, const std::string& what) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    fail("{}: parameter dtype {} is not supported (expected F32 or BF16)", what, dtype_safetensors_name(dtype));
}

// One checkpoint tensor to copy into (a slice of) one parameter.
struct CopyJob {
  Tensor src;
  Tensor dst;
};

}  // namespace

std::vector<std::pair<std::string, Tensor*>> Qwen3MoeWeights::named_parameters() {
  std::vector<std::pair<std::string, Tensor*>> r;
  parameters_visit(*this, [&](const std::string& n, Tensor& t) { r.emplace_back(n, &t); });
  return r;
}

std::vector<std::pair<std::string, const Tensor*>> Qwen3MoeWeights::named_parameters() const {
  std::vector<std::pair<std::string, const Tensor*>> r;
  parameters_visit(*this, [&](const std::string& n, const Tensor& t) { r.emplace_back(n, &t); });
  return r;
}

Qwen3MoeWeights Qwen3MoeWeights::empty_like_config(const Qwen3MoeConfig& cfg, DType dtype, Device device,
                                                   int64_t experts_held) {
  check_param_dtype(dtype, "empty_like_config");
  return weights_alloc(cfg, dtype, device, experts_held);
}

Qwen3MoeWeights Qwen3MoeWeights::absent_like_config(const Qwen3MoeConfig& cfg, DType dtype, Device device,
                                                    int64_t experts_held) {
  check_param_dtype(dtype, "absent_like_config");
  return weights_alloc(cfg, dtype, device, experts_held, /*absent=*/true);
}

Qwen3MoeWeights Qwen3MoeWeights::zeros_like_config(const Qwen3MoeConfig& cfg, DType dtype, int64_t experts_held) {
  check_param_dtype(dtype, "zeros_like_config");
  Qwen3MoeWeights w = weights_alloc(cfg, dtype, Device::cpu(), experts_held);
  for (auto& [name, t] : w.named_parameters()) t->fill_zero();
  return w;
}

Qwen3MoeWeights Qwen3MoeWeights::random_init(const Qwen3MoeConfig& cfg, DType dtype, uint64_t seed) {
  check_param_dtype(dtype, "random_init");
  Qwen3MoeWeights w = weights_alloc(cfg, dtype);
  auto params = w.named_parameters();
  // One stream per parameter name: the values do not depend on visiting order or threading.
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i].first;
    Tensor& t = *params[i].second;
    std::vector<float> v(static_cast<size_t>(t.numel()));
    if (name_is_norm(name)) {
      std::fill(v.begin(), v.end(), 1.0f);
    } else {
      Rng rng(seed, rng_stream_of(name));
      rng.fill_normal(v.data(), t.numel(), 0.0, cfg.initializer_range);
    }
    float* out = t.dtype() == DType::F32 ? t.data_as<float>() : nullptr;
    if (out) {
      std::copy(v.begin(), v.end(), out);
    } else {
      auto* o = t.data_as<uint16_t>();
      for (size_t k = 0; k < v.size(); ++k) o[k] = float_to_bf16(v[k]);
    }
  }
  return w;
}

Qwen3MoeWeights Qwen3MoeWeights::from_hf(const Qwen3MoeConfig& cfg, DType dtype,
                                         const std::function<Tensor(const std::string&)>& lookup,
                                         const std::vector<std::string>& all_names, const std::string& source,
                                         int64_t expert_first, int64_t expert_count,
                                         const std::function<bool(const std::string&)>& skip, bool compact_experts) {
  check_param_dtype(dtype, source);
  const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size;
  if (expert_count < 0) expert_first = 0, expert_count = E;
  MT_CHECK(expert_first >= 0 && expert_first + expert_count <= E, "{}: experts [{}, {}) of {}", source, expert_first,
           expert_first + expert_count, E);
  const int64_t e0 = expert_first, e1 = expert_first + expert_count;
  const std::set<std::string> stored(all_names.begin(), all_names.end());
  std::set<std::string> used;

  // Pass 1: find and check every tensor before allocating anything.
  struct Source {
    std::string name;
    Tensor t;
  };
  // How the checkpoint tensors of one parameter are laid into it.
  enum class Fill { Whole, StackedExperts, PerExpertGateUp, PerExpertDown };
  struct Plan {
    std::vector<Source> parts;
    Fill fill = Fill::Whole;
  };
  std::vector<Plan> sources;  // parallel to named_parameters() of the result
  auto whole = [&](Source src) { sources.push_back(Plan{{std::move(src)}, Fill::Whole}); };
  auto fetch = [&](const std::string& name, const Shape& shape) {
    Tensor t = stored.count(name) ? lookup(name) : Tensor();
    if (!t.defined()) fail("{}: tensor '{}' is missing (expected shape {})", source, name, shape_str(shape));
    if (t.shape() != shape)
      fail("{}: tensor '{}': wrong shape (expected {}, found {})", source, name, shape_str(shape),
           shape_str(t.shape()));
    if (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16)
      fail("{}: tensor '{}': unsupported dtype (expected F32, BF16 or F16, found {})", source, name,
           dtype_safetensors_name(t.dtype()));
    if (!t.device().is_cpu()) fail("{}: tensor '{}': expected a CPU tensor, found {}", source, name, t.device().str());
    used.insert(name);
    return Source{name, t};
  };

  const int64_t V = cfg.vocab_size, D = cfg.head_dim;
  const int64_t nq = cfg.num_attention_heads * D, nkv = cfg.num_key_value_heads * D, F = cfg.intermediate_size;
  whole(fetch("model.embed_tokens.weight", {V, H}));
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(static_cast<size_t>(l));
    whole(fetch(p + "self_attn.q_proj.weight", {nq, H}));
    whole(fetch(p + "self_attn.k_proj.weight", {nkv, H}));
    whole(fetch(p + "self_attn.v_proj.weight", {nkv, H}));
    whole(fetch(p + "self_attn.o_proj.weight", {H, nq}));
    whole(fetch(p + "self_attn.q_norm.weight", {D}));
    whole(fetch(p + "self_attn.k_norm.weight", {D}));
    if (cfg.is_moe_layer(l)) {
      whole(fetch(p + "mlp.gate.weight", {E, H}));
      // save_original_format=False checkpoints hold the fused v5 tensors; the default holds per-expert ones.
      const std::string fused_gu = p + "mlp.experts.gate_up_proj", fused_down = p + "mlp.experts.down_proj";
      if (stored.count(fused_gu)) {
        sources.push_back(Plan{{fetch(fused_gu, {E, 2 * I, H})}, Fill::StackedExperts});
      } else {
        std::vector<Source> parts;  // gate_0, up_0, gate_1, up_1, ...
        for (int64_t e = 0; e < E; ++e) {
          const std::string pe = fmt::format("{}mlp.experts.{}.", p, e);
          parts.push_back(fetch(pe + "gate_proj.weight", {I, H}));
          parts.push_back(fetch(pe + "up_proj.weight", {I, H}));
        }
        sources.push_back({std::move(parts), Fill::PerExpertGateUp});
      }
      if (stored.count(fused_down)) {
        sources.push_back(Plan{{fetch(fused_down, {E, H, I})}, Fill::StackedExperts});
      } else {
        std::vector<Source> parts;
        for (int64_t e = 0; e < E; ++e)
          parts.push_back(fetch(fmt::format("{}mlp.experts.{}.down_proj.weight", p, e), {H, I}));
        sources.push_back({std::move(parts), Fill::PerExpertDown});
      }
    } else {
      whole(fetch(p + "mlp.gate_proj.weight", {F, H}));
      whole(fetch(p + "mlp.up_proj.weight", {F, H}));
      whole(fetch(p + "mlp.down_proj.weight", {H, F}));
    }
    whole(fetch(p + "input_layernorm.weight", {H}));
    whole(fetch(p + "post_attention_layernorm.weight", {H}));
  }
  whole(fetch("model.norm.weight", {H}));
  if (cfg.tie_word_embeddings)
    used.insert("lm_head.weight");  // HF drops a stored copy of a tied head without complaint
  else
    whole(fetch("lm_head.weight", {V, H}));

  std::vector<std::string> extra;
  for (const std::string& n : all_names)
    if (!used.count(n)) extra.push_back(n);
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", " : "") + extra[i];
    fail("{}: {} unexpected tensor(s) for {}: {}{}", source, extra.size(), cfg.architecture, list,
         extra.size() > 5 ? ", ..." : "");
  }

  // Pass 2: allocate and copy (converting dtype). Same-dtype copies are byte copies. Compact stacks take expert
  // e at row e - e0.
  const int64_t row0 = compact_experts ? e0 : 0;
  Qwen3MoeWeights w = weights_alloc(cfg, dtype, Device::cpu(), compact_experts ? expert_count : -1);
  auto params = w.named_parameters();
  MT_CHECK(params.size() == sources.size(), "{} parameters, {} sources", params.size(), sources.size());
  std::vector<CopyJob> jobs;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor& dst = *params[i].second;
    if (skip && skip(params[i].first)) {  // its untouched allocation is returned at once
      dst = Tensor::absent(dst.shape(), dst.dtype(), dst.device());
      continue;
    }
    const std::vector<Source>& src = sources[i].parts;
    switch (sources[i].fill) {
      case Fill::Whole:
        jobs.push_back({src[0].t, dst});
        break;
      case Fill::StackedExperts:
        jobs.push_back({src[0].t.rows(e0, e1), dst.rows(e0 - row0, e1 - row0)});
        break;
      case Fill::PerExpertGateUp:  // [E, 2I, H]: gate rows first, then up (HF Concatenate(dim=1))
        for (int64_t e = e0; e < e1; ++e) {
          jobs.push_back({src[2 * e].t, dst[e - row0].rows(0, I)});
          jobs.push_back({src[2 * e + 1].t, dst[e - row0].rows(I, 2 * I)});
        }
        break;
      case Fill::PerExpertDown:
        for (int64_t e = e0; e < e1; ++e) jobs.push_back({src[e].t, dst[e - row0]});
        break;
    }
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i].dst.copy_from(jobs[i].src);
  return w;
}

std::vector<std::pair<std::string, Tensor>> Qwen3MoeWeights::to_hf(const Qwen3MoeConfig& cfg,
                                                                   int64_t expert_first) const {
  MT_CHECK(static_cast<int64_t>(layers.size()) == cfg.num_hidden_layers, "{} layers for a config of {}",
           layers.size(), cfg.num_hidden_layers);
  MT_CHECK(lm_head.defined() != cfg.tie_word_embeddings, "tie_word_embeddings={} but lm_head is {}",
           cfg.tie_word_embeddings, lm_head.defined() ? "defined" : "undefined");
  std::vector<std::pair<std::string, const Tensor*>> params = named_parameters();
  // Order as save_pretrained emits it (checked against the Transformers 5.17 fixtures' shard
  // layout): a model with a weight conversion (qwen3_moe) is written in sorted in-memory name
  // order, each fused expert tensor expanding in place; the dense Qwen3 keeps state_dict order.
  if (cfg.architecture == "Qwen3MoeForCausalLM")
    std::sort(params.begin(), params.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Fused experts revert to per-expert tensors (Chunk + SplitModulelist): all downs, then all
  // gates, then all ups. They are views of the stacked storage, so the bytes are exact copies.
  std::vector<std::pair<std::string, Tensor>> r;
  for (const auto& [name, t] : params) {
    const size_t cut = name.rfind("experts.");
    const bool gate_up = name.ends_with("mlp.experts.gate_up_proj");
    if (!gate_up && !name.ends_with("mlp.experts.down_proj")) {
      r.emplace_back(name, *t);
      continue;
    }
    const std::string p = name.substr(0, cut + std::string("experts.").size());
    // Expert e's matrix (rows [r0, r1) of it): a view where the stack holds it, else its shape only.
    const int64_t E = cfg.num_experts, held = t->dim(0);
    const int64_t first = held < E ? expert_first : 0;
    MT_CHECK(first >= 0 && first + held <= E, "{}: experts [{}, {}) of {}", name, first, first + held, E);
    auto expert = [&](int64_t e, int64_t r0, int64_t r1) {
      if (e >= first && e < first + held) return (*t)[e - first].rows(r0, r1);
      Shape shape(t->shape().begin() + 1, t->shape().end());
      shape[0] = r1 - r0;
      return Tensor::absent(shape, t->dtype(), t->device());
    };
    const int64_t rows = t->dim(1);
    if (!gate_up) {
      for (int64_t e = 0; e < E; ++e) r.emplace_back(fmt::format("{}{}.down_proj.weight", p, e), expert(e, 0, rows));
      continue;
    }
    const int64_t I = rows / 2;
    for (int64_t e = 0; e < E; ++e) r.emplace_back(fmt::format("{}{}.gate_proj.weight", p, e), expert(e, 0, I));
    for (int64_t e = 0; e < E; ++e) r.emplace_back(fmt::format("{}{}.up_proj.weight", p, e), expert(e, I, 2 * I));
  }
  return r;
}

int64_t Qwen3MoeWeights::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t->numel();
  return n;
}

}  // namespace mt
