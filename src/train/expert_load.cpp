#include "train/expert_load.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/expert_bias.h"

namespace mt {

namespace {
// E of layer l's MoE sublayer, or 0 when it has none (a layer holds at most one feed-forward sublayer).
int64_t layer_experts(const DecoderSpec& cfg, int64_t l) {
  for (const Sublayer& s : cfg.layers[static_cast<size_t>(l)].sublayers)
    if (s.kind == SublayerKind::moe) return cfg.moe[static_cast<size_t>(s.index)].num_experts;
  return 0;
}

ExpertLoads views_of(const DecoderSpec* cfg, const ExpertLoads* like, Tensor flat) {
  ExpertLoads r;
  r.flat = std::move(flat);
  const size_t n = cfg ? static_cast<size_t>(cfg->num_layers()) : like->layers.size();
  r.layers.resize(n);
  int64_t at = 0;
  for (size_t l = 0; l < n; ++l) {
    const int64_t E = cfg ? layer_experts(*cfg, static_cast<int64_t>(l))
                          : (like->layers[l].defined() ? like->layers[l].dim(0) : 0);
    if (E == 0) continue;
    r.layers[l] = r.flat.rows(at, at + E);
    at += E;
  }
  return r;
}
}  // namespace

ExpertLoads ExpertLoads::zeros(const DecoderSpec& cfg) {
  int64_t total = 0;
  for (int64_t l = 0; l < cfg.num_layers(); ++l) total += layer_experts(cfg, l);
  if (total == 0) {
    ExpertLoads r;
    r.layers.resize(static_cast<size_t>(cfg.num_layers()));
    return r;
  }
  return views_of(&cfg, nullptr, Tensor::zeros({total}, DType::I32));
}

ExpertLoads ExpertLoads::like(Device device) const {
  if (empty()) return *this;
  return views_of(nullptr, this, Tensor::empty(flat.shape(), DType::I32, device));
}

double expert_loads_max_over_mean(const ExpertLoads& loads) {
  double most = 0;
  for (const Tensor& t : loads.layers)
    if (t.defined()) most = std::max(most, cpu::expert_load_max_over_mean(t));
  return most;
}

void expert_bias_update_all(const ExpertLoads& loads, ModelWeights& w, double rate) {
  MT_CHECK(loads.layers.size() == w.layers.size(), "expert loads of {} layers for {} model layers", loads.layers.size(),
           w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l)
    if (loads.layers[l].defined() && w.layers[l].router_score_bias.defined())
      cpu::expert_bias_update(loads.layers[l], w.layers[l].router_score_bias, rate);
}

bool spec_has_correction_bias(const DecoderSpec& cfg) {
  return std::any_of(cfg.moe.begin(), cfg.moe.end(), [](const MoeSpec& m) { return m.router.correction_bias; });
}

void expert_bias_recipe_check(const Recipe& r, const DecoderSpec& cfg) {
  if (r.moe.bias_update_rate > 0 && r.peft.enabled)  // recipe_load says it first
    fail("{}: moe.bias_update_rate: LoRA training keeps the base model frozen, and the selection bias is part of it "
         "(an adapter checkpoint does not carry it); set 0, or train in full (no peft section)",
         r.file.empty() ? std::string("recipe") : r.file);
  if (r.moe.bias_update_rate > 0 && !spec_has_correction_bias(cfg))
    fail("{}: moe.bias_update_rate: {} needs a model whose router has a selection bias (e_score_correction_bias, as "
         "DeepSeek-V3's); this {} model has none (set 0 or leave it out)",
         r.file.empty() ? std::string("recipe") : r.file, r.moe.bias_update_rate,
         cfg.model_type.empty() ? std::string("MoE") : cfg.model_type);
}

}  // namespace mt
