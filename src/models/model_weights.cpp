#include "models/model_weights.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/error.h"
#include "core/float_convert.h"
#include "core/rng.h"
#include "models/hf_checkpoint_map.h"
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
    &LayerWeights::q_bias,          &LayerWeights::k_bias,       &LayerWeights::v_bias, &LayerWeights::o_bias,
    &LayerWeights::sinks,           &LayerWeights::router_bias,  &LayerWeights::experts_gate_up_bias,
    &LayerWeights::experts_down_bias,
    &LayerWeights::q_a_proj,        &LayerWeights::q_a_norm,     &LayerWeights::q_b_proj,
    &LayerWeights::kv_a_proj,       &LayerWeights::kv_a_norm,    &LayerWeights::kv_b_proj,
    &LayerWeights::router_score_bias,
    &LayerWeights::shared_gate,     &LayerWeights::shared_up,    &LayerWeights::shared_down,
    &LayerWeights::mamba_in_proj,   &LayerWeights::mamba_in_proj_bias, &LayerWeights::mamba_conv_weight,
    &LayerWeights::mamba_conv_bias, &LayerWeights::mamba_dt_bias, &LayerWeights::mamba_a_log, &LayerWeights::mamba_d,
    &LayerWeights::mamba_norm,      &LayerWeights::mamba_out_proj, &LayerWeights::mamba_out_proj_bias,
};
static_assert(WeightSlot::input_norm == 3 && WeightSlot::experts_down_bias == 24 && WeightSlot::q_a_proj == 25 &&
                  WeightSlot::router_score_bias == 31 && WeightSlot::shared_down == 34 &&
                  WeightSlot::mamba_in_proj == 35 && WeightSlot::mamba_out_proj_bias == 44 &&
                  std::size(kLayerSlots) == WeightSlot::last_layer_slot - WeightSlot::input_norm + 1,
              "kLayerSlots follows WeightSlot");

template <typename W>
auto& slot_of(W& w, const ParamEntry& e) {
  if (e.layer < 0) {
    MT_CHECK(e.slot >= WeightSlot::embed && e.slot <= WeightSlot::lm_head, "{}: slot {}", e.name, e.slot);
    return w.*kModelSlots[e.slot];
  }
  MT_CHECK(static_cast<size_t>(e.layer) < w.layers.size() && e.slot >= WeightSlot::input_norm &&
               e.slot <= WeightSlot::last_layer_slot,
           "{}: layer {} slot {} of a struct with {} layers", e.name, e.layer, e.slot, w.layers.size());
  return w.layers[static_cast<size_t>(e.layer)].*kLayerSlots[e.slot - WeightSlot::input_norm];
}

// The table's parameters (buffers = false) or its buffers (true), in table order.
template <typename P, typename W>
std::vector<std::pair<std::string, P>> named_of(W& w, bool buffers = false) {
  std::vector<std::pair<std::string, P>> r;
  if (!w.table) return r;
  r.reserve(w.table->entries().size());
  for (const ParamEntry& e : w.table->entries())
    if ((e.role == ParamRole::buffer) == buffers) r.emplace_back(e.name, &slot_of(w, e));
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

std::vector<std::pair<std::string, Tensor*>> ModelWeights::named_buffers() { return named_of<Tensor*>(*this, true); }

std::vector<std::pair<std::string, const Tensor*>> ModelWeights::named_buffers() const {
  return named_of<const Tensor*>(*this, true);
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
  MT_CHECK(!cfg.padding_idx || (*cfg.padding_idx >= 0 && *cfg.padding_idx < cfg.vocab_size),
           "random_init: padding_idx {} outside the vocabulary [0, {})", cfg.padding_idx.value_or(0), cfg.vocab_size);
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
      case ParamInit::a_log:
        for (size_t h = 0; h < v.size(); ++h) v[h] = static_cast<float>(std::log(static_cast<double>(h + 1)));
        break;
      case ParamInit::dt_bias: {
        const Mamba2Spec* m = cfg.mamba2_of(e.layer);
        MT_CHECK(m != nullptr, "random_init: {} outside a Mamba2 layer", e.name);
        Rng rng(seed, rng_stream_of(e.name));
        const double lo = std::log(m->time_step_min), hi = std::log(m->time_step_max);
        for (float& x : v) {
          const double dt = std::max(std::exp(rng.uniform() * (hi - lo) + lo), m->time_step_floor);
          x = static_cast<float>(dt + std::log(-std::expm1(-dt)));  // softplus⁻¹(dt)
        }
        break;
      }
    }
    // Transformers' _init_weights zeroes nn.Embedding's padding_idx row (a tied head shares it).
    if (e.use == ParamUse::embedding && cfg.padding_idx) {
      const int64_t H = e.shape.back();
      std::fill_n(v.begin() + *cfg.padding_idx * H, H, 0.0f);
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
                                         const std::function<bool(const std::string&)>& skip, bool compact_experts,
                                         const std::function<std::string(const std::string&)>& file_of) {
  check_param_dtype(dtype, source);
  const int64_t E = cfg.num_experts();
  if (expert_count >= 0)
    MT_CHECK(expert_first >= 0 && expert_first + expert_count <= E, "{}: experts [{}, {}) of {}", source,
             expert_first, expert_first + expert_count, E);
  auto table = std::make_shared<const ParamTable>(param_table_of(cfg));
  // The family's rules read the checkpoint (checking every tensor before anything is allocated).
  const HfNameMap map = hf_name_map_of(cfg, *table, dtype);
  HfCheckpoint ckpt;
  ckpt.source = source;
  ckpt.names = all_names;
  ckpt.tensor = lookup;
  ckpt.file_of = file_of;
  HfLoadOptions options;
  options.expert_first = expert_count >= 0 ? expert_first : 0;
  options.expert_count = expert_count;
  options.compact_experts = compact_experts;
  options.skip = skip;
  options.fp8_declared = cfg.quant.method == CheckpointQuant::Method::fp8_block;
  options.fp8_block_rows = cfg.quant.block_rows;
  options.fp8_block_cols = cfg.quant.block_cols;
  std::vector<Tensor> values = map.load(ckpt, options);
  ModelWeights w;
  w.table = table;
  w.layers.resize(static_cast<size_t>(cfg.num_layers()));
  const std::vector<ParamEntry>& entries = table->entries();
  MT_CHECK(entries.size() == values.size(), "{} parameters, {} loaded", entries.size(), values.size());
  for (size_t i = 0; i < entries.size(); ++i) w.slot(entries[i]) = std::move(values[i]);
  return w;
}

std::vector<std::pair<std::string, Tensor>> ModelWeights::to_hf(const DecoderSpec& cfg,
                                                                   int64_t expert_first) const {
  MT_CHECK(static_cast<int64_t>(layers.size()) == cfg.num_layers(), "{} layers for a config of {}",
           layers.size(), cfg.num_layers());
  MT_CHECK(lm_head.defined() != cfg.tie_word_embeddings, "tie_word_embeddings={} but lm_head is {}",
           cfg.tie_word_embeddings, lm_head.defined() ? "defined" : "undefined");
  const ParamTable& t = param_table();
  // The model's parameter dtype: that of any entry which follows it (all of them do).
  DType dtype = DType::F32;
  for (const ParamEntry& e : t.entries())
    if (e.dtype == ParamDType::model) {
      dtype = slot(e).dtype();
      break;
    }
  std::vector<Tensor> values;
  values.reserve(t.entries().size());
  for (const ParamEntry& e : t.entries()) values.push_back(slot(e));
  // Experts a compact stack does not hold come back absent (shape only), so a shared save lays out the whole
  // model while this rank writes its experts.
  return hf_name_map_of(cfg, t, dtype).save(values, expert_first);
}

int64_t ModelWeights::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t->numel();
  return n;
}

}  // namespace mt
