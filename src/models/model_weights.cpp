#include "models/model_weights.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/float_convert.h"
#include "core/rng.h"
#include "models/registry.h"

namespace mt {

namespace {

// The member of ModelWeights / LayerWeights a WeightSlot names.
constexpr Tensor ModelWeights::*kModelSlots[] = {&ModelWeights::embed, &ModelWeights::final_norm,
                                                 &ModelWeights::lm_head};
constexpr Tensor LayerWeights::*kLayerSlots[] = {
    &LayerWeights::input_norm,      &LayerWeights::q_proj,       &LayerWeights::k_proj, &LayerWeights::v_proj,
    &LayerWeights::o_proj,          &LayerWeights::q_norm,       &LayerWeights::k_norm, &LayerWeights::post_norm,
    &LayerWeights::router,          &LayerWeights::experts_gate_up, &LayerWeights::experts_down,
    &LayerWeights::mlp_gate,        &LayerWeights::mlp_up,       &LayerWeights::mlp_down,
};
static_assert(WeightSlot::input_norm == 3 && WeightSlot::mlp_down == 16, "kLayerSlots follows WeightSlot");

template <typename W>
auto& slot_of(W& w, const ParamEntry& e) {
  if (e.layer < 0) {
    MT_CHECK(e.slot >= WeightSlot::embed && e.slot <= WeightSlot::lm_head, "{}: slot {}", e.name, e.slot);
    return w.*kModelSlots[e.slot];
  }
  MT_CHECK(static_cast<size_t>(e.layer) < w.layers.size() && e.slot >= WeightSlot::input_norm &&
               e.slot <= WeightSlot::mlp_down,
           "{}: layer {} slot {} of a struct with {} layers", e.name, e.layer, e.slot, w.layers.size());
  return w.layers[static_cast<size_t>(e.layer)].*kLayerSlots[e.slot - WeightSlot::input_norm];
}

template <typename P, typename W>
std::vector<std::pair<std::string, P>> named_of(W& w) {
  std::vector<std::pair<std::string, P>> r;
  if (!w.table) return r;
  r.reserve(w.table->entries().size());
  for (const ParamEntry& e : w.table->entries())
    if (e.role != ParamRole::buffer) r.emplace_back(e.name, &slot_of(w, e));
  return r;
}

// Every table entry allocated (uninitialised), or only described (absent), in the table's order.
ModelWeights weights_alloc(const DecoderSpec& cfg, std::shared_ptr<const ParamTable> table, DType dtype,
                              Device device = Device::cpu(), int64_t experts_held = -1, bool absent = false) {
  ModelWeights w;
  w.table = std::move(table);
  w.layers.resize(static_cast<size_t>(cfg.num_layers()));
  for (const ParamEntry& e : w.table->entries()) {
    const Shape shape = param_shape_held(e, experts_held);
    const DType dt = param_dtype(e, dtype);
    slot_of(w, e) = absent ? Tensor::absent(shape, dt, device) : Tensor::empty(shape, dt, device);
  }
  return w;
}

ModelWeights weights_alloc(const DecoderSpec& cfg, DType dtype, Device device = Device::cpu(),
                              int64_t experts_held = -1, bool absent = false) {
  return weights_alloc(cfg, std::make_shared<const ParamTable>(param_table_of(cfg)), dtype, device,
                       experts_held, absent);
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

const ParamTable& ModelWeights::param_table() const {
  MT_CHECK(table != nullptr, "weights without a parameter table (a default-constructed struct)");
  return *table;
}

Tensor& ModelWeights::slot(const ParamEntry& e) { return slot_of(*this, e); }
const Tensor& ModelWeights::slot(const ParamEntry& e) const { return slot_of(*this, e); }

std::vector<std::pair<std::string, Tensor*>> ModelWeights::named_parameters() { return named_of<Tensor*>(*this); }

std::vector<std::pair<std::string, const Tensor*>> ModelWeights::named_parameters() const {
  return named_of<const Tensor*>(*this);
}

ModelWeights ModelWeights::empty_like_config(const DecoderSpec& cfg, DType dtype, Device device,
                                                   int64_t experts_held) {
  check_param_dtype(dtype, "empty_like_config");
  return weights_alloc(cfg, dtype, device, experts_held);
}

ModelWeights ModelWeights::absent_like_config(const DecoderSpec& cfg, DType dtype, Device device,
                                                    int64_t experts_held) {
  check_param_dtype(dtype, "absent_like_config");
  return weights_alloc(cfg, dtype, device, experts_held, /*absent=*/true);
}

ModelWeights ModelWeights::zeros_like_config(const DecoderSpec& cfg, DType dtype, int64_t experts_held) {
  check_param_dtype(dtype, "zeros_like_config");
  ModelWeights w = weights_alloc(cfg, dtype, Device::cpu(), experts_held);
  for (const ParamEntry& e : w.table->entries()) w.slot(e).fill_zero();
  return w;
}

ModelWeights ModelWeights::random_init(const DecoderSpec& cfg, DType dtype, uint64_t seed) {
  check_param_dtype(dtype, "random_init");
  ModelWeights w = weights_alloc(cfg, dtype);
  const std::vector<ParamEntry>& entries = w.table->entries();
  // One stream per parameter name: the values do not depend on visiting order or threading.
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < entries.size(); ++i) {
    const ParamEntry& e = entries[i];
    Tensor& t = w.slot(e);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    switch (e.init) {
      case ParamInit::ones: std::fill(v.begin(), v.end(), 1.0f); break;
      case ParamInit::zeros: std::fill(v.begin(), v.end(), 0.0f); break;
      case ParamInit::normal: {
        Rng rng(seed, rng_stream_of(e.name));
        rng.fill_normal(v.data(), t.numel(), 0.0, cfg.initializer_range);
        break;
      }
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

ModelWeights ModelWeights::from_hf(const DecoderSpec& cfg, DType dtype,
                                         const std::function<Tensor(const std::string&)>& lookup,
                                         const std::vector<std::string>& all_names, const std::string& source,
                                         int64_t expert_first, int64_t expert_count,
                                         const std::function<bool(const std::string&)>& skip, bool compact_experts) {
  check_param_dtype(dtype, source);
  const int64_t E = cfg.num_experts();
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
  std::vector<Plan> sources;  // parallel to the table's entries
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

  // The table drives the fetch list: every entry is one stored tensor, but an expert stack, which the default
  // save_original_format holds per expert (save_original_format=False checkpoints hold the fused v5 tensor).
  auto table = std::make_shared<const ParamTable>(param_table_of(cfg));
  for (const ParamEntry& e : table->entries()) {
    if (e.role != ParamRole::expert_stack) {
      whole(fetch(e.name, e.shape));
      continue;
    }
    if (stored.count(e.name)) {
      sources.push_back(Plan{{fetch(e.name, e.shape)}, Fill::StackedExperts});
      continue;
    }
    const std::string pe = e.name.substr(0, e.name.rfind("experts.") + std::string("experts.").size());
    const Shape one(e.shape.begin() + 1, e.shape.end());  // one expert's matrix
    if (e.name.ends_with(".gate_up_proj")) {
      const Shape half{one[0] / 2, one[1]};
      std::vector<Source> parts;  // gate_0, up_0, gate_1, up_1, ...
      for (int64_t x = 0; x < e.shape[0]; ++x) {
        parts.push_back(fetch(fmt::format("{}{}.gate_proj.weight", pe, x), half));
        parts.push_back(fetch(fmt::format("{}{}.up_proj.weight", pe, x), half));
      }
      sources.push_back({std::move(parts), Fill::PerExpertGateUp});
    } else {
      MT_CHECK(e.name.ends_with(".down_proj"), "{}: no per-expert checkpoint names for this stack", e.name);
      std::vector<Source> parts;
      for (int64_t x = 0; x < e.shape[0]; ++x) parts.push_back(fetch(fmt::format("{}{}.down_proj.weight", pe, x), one));
      sources.push_back({std::move(parts), Fill::PerExpertDown});
    }
  }
  if (table->tied_embeddings) used.insert("lm_head.weight");  // HF drops a stored copy of a tied head without complaint

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
  ModelWeights w = weights_alloc(cfg, table, dtype, Device::cpu(), compact_experts ? expert_count : -1);
  const std::vector<ParamEntry>& entries = table->entries();
  MT_CHECK(entries.size() == sources.size(), "{} parameters, {} sources", entries.size(), sources.size());
  std::vector<CopyJob> jobs;
  for (size_t i = 0; i < entries.size(); ++i) {
    Tensor& dst = w.slot(entries[i]);
    if (skip && skip(entries[i].name)) {  // its untouched allocation is returned at once
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
        for (int64_t e = e0, I = dst.dim(1) / 2; e < e1; ++e) {
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

std::vector<std::pair<std::string, Tensor>> ModelWeights::to_hf(const DecoderSpec& cfg,
                                                                   int64_t expert_first) const {
  MT_CHECK(static_cast<int64_t>(layers.size()) == cfg.num_layers(), "{} layers for a config of {}",
           layers.size(), cfg.num_layers());
  MT_CHECK(lm_head.defined() != cfg.tie_word_embeddings, "tie_word_embeddings={} but lm_head is {}",
           cfg.tie_word_embeddings, lm_head.defined() ? "defined" : "undefined");
  std::vector<std::pair<std::string, const Tensor*>> params = named_parameters();
  // Order as save_pretrained emits it (checked against the Transformers 5.17 fixtures' shard
  // layout): a model with a weight conversion (qwen3_moe) is written in sorted in-memory name
  // order, each fused expert tensor expanding in place; others (the dense Qwen3) keep state_dict order.
  if (architecture_lookup(cfg.architecture, "to_hf").save_order == HfSaveOrder::sorted_names)
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
    const int64_t E = cfg.num_experts(), held = t->dim(0);
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

int64_t ModelWeights::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t->numel();
  return n;
}

}  // namespace mt
