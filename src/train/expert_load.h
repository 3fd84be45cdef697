// The routed-expert loads of one optimizer step, per MoE layer: the balance metric of every MoE family (metrics.jsonl
// expert_load_max_over_mean: the largest over layers of max_e load_e / mean load) and the input of DeepSeek-V3's
// auxiliary-loss-free bias update (recipe moe.bias_update_rate; kernels/cpu/expert_bias.h states the rule).
// The engines count every micro-batch of a step (forward_backward only: neither eval nor a recompute counts), sum
// the counts over the ranks (each rank routes its own tokens over all E experts, also under expert parallelism),
// and after the optimizer step update every layer's bias on every rank alike. A skipped (non-finite) step updates
// nothing.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "models/model_weights.h"
#include "models/spec/decoder_spec.h"
#include "train/recipe.h"

namespace mt {

struct ExpertLoads {
  Tensor flat;                 // I32 [Σ_l E_l] over the MoE layers, in layer order; undefined: no MoE layer
  std::vector<Tensor> layers;  // per decoder layer: its rows of flat, I32 [E], undefined for a layer without MoE

  // Zeros on the CPU for cfg's MoE layers; device tensors come from like(): the same layout on another device.
  static ExpertLoads zeros(const DecoderSpec& cfg);
  ExpertLoads like(Device device) const;  // uninitialised
  bool empty() const { return !flat.defined(); }
};

// The largest over the MoE layers of max_e load_e / mean load (CPU loads); 0 when there is none.
double expert_loads_max_over_mean(const ExpertLoads& loads);

// bias_e += rate · sign(mean − load_e) on every layer of w with a selection bias (LayerWeights::router_score_bias, a
// CPU F32 buffer), from that layer's CPU loads.
void expert_bias_update_all(const ExpertLoads& loads, ModelWeights& w, double rate);

// Whether a MoE layer of cfg has a selection bias buffer (RouterSpec::correction_bias: DeepSeek-V3, Nemotron-H).
bool spec_has_correction_bias(const DecoderSpec& cfg);
// moe.bias_update_rate > 0 needs such a model and full training (not LoRA): a one-line error naming the recipe file
// and field otherwise.
void expert_bias_recipe_check(const Recipe& r, const DecoderSpec& cfg);

}  // namespace mt
