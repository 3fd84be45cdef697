// DeepSeek-V3's group-limited sigmoid router (DeepseekV3TopkRouter.forward in Transformers 5.17, hf-numerics.md §5.3;
// NemotronHTopkRouter is the same code, used with n_group 1), after the fp32 router linear:
//   s = sigmoid(logits)                       fp32, 1 / (1 + exp(−x))
//   c = s + e_score_correction_bias           fp32, used for the selection only
//   group score = top1 + top2 of c inside each of `groups` contiguous groups of E/groups experts
//   keep the `topk_groups` best groups; c of the other groups = −inf (HF's masked_fill value)
//   index = top-k of c;  value = s gathered at index (the UNBIASED sigmoid)
//   norm_topk_prob: value /= (Σ value + 1e-20);  weights = value · fp32(scale)
// Everything is fp32 in a bf16 model too (HF casts x and W to fp32 for the router linear and keeps the bias buffer
// fp32, `_keep_in_fp32_modules_strict`); the weights are NOT rounded to bf16, so the `bf16` flag changes nothing here.
//
// Order and ties (HF uses topk(sorted=False), whose order is unspecified): groups and experts are ranked by
// descending value, equal values to the lower index, NaN above every number (torch.topk's NaN rule), as
// cpu::topk_row does; slots hold the experts by descending biased score c. Σ value is summed in slot order.
// Kept for exactness: when topk_groups == groups nothing is masked and the grouping is skipped (HF computes it and
// masks nothing), so E = 1 works; with real grouping each group needs ≥ 2 experts (HF's topk(2) needs them too).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cpu/router.h"

namespace mt::cpu {

struct SigmoidGroupRouting {
  int64_t top_k = 0;            // num_experts_per_tok
  int64_t groups = 1;           // n_group (divides E)
  int64_t topk_groups = 1;      // topk_group (1 ≤ topk_groups ≤ groups; top_k ≤ topk_groups · E/groups)
  bool norm_topk_prob = true;
  double scale = 1.0;           // routed_scaling_factor (applied as fp32, like torch's tensor · python float)
};

// Throws mt::Error naming the field when `r` does not fit `experts` (E ≥ 1; groups dividing E; 1 ≤ topk_groups ≤
// groups; 1 ≤ top_k ≤ topk_groups·E/groups; groups of ≥ 2 experts when some are masked; scale finite).
void check_sigmoid_group_routing(const SigmoidGroupRouting& r, int64_t experts);

// logits F32 [T, E] (fp32 router linear output); correction_bias F32|BF16 [E], or undefined for none (zeros).
// -> probs = s F32 [T, E], index I32 [T, k], value F32 [T, k] (after the optional normalisation, before the
// scale), weights F32 [T, k] (= value · scale; fp32 in both modes).
RouterOutput router_sigmoid_group_forward(const Tensor& logits, const Tensor& correction_bias,
                                          const SigmoidGroupRouting& r, bool bf16);

// dweights F32 [T, k] = d(loss)/d(weights) -> dlogits F32 [T, E] through the scale, the normalisation (with its
// 1e-20), the gather and sigmoid' = s·(1 − s), from route.probs and route.index (value is not read). Nonzero on the
// selected experts only: the bias and the selection carry no gradient.
Tensor router_sigmoid_group_backward(const Tensor& dweights, const RouterOutput& route, const SigmoidGroupRouting& r);

// Per-expert loads for the aux-loss-free bias update: load[e] += number of slots of `index` (I32 [T, k]) that hold e.
// load I32 [E] on the CPU; an index outside [0, E) throws.
void router_expert_load_add(const Tensor& index, Tensor& load);
// The same into a fresh zeroed I32 [experts].
Tensor router_expert_load(const Tensor& index, int64_t experts);

}  // namespace mt::cpu
