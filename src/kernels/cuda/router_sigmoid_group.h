// DeepSeek-V3's group-limited sigmoid router on the GPU (the CPU twin is kernels/cpu/router_sigmoid_group.h, whose
// header states the math, hf-numerics.md §5.3; Nemotron-H uses it with one group). After the fp32 router GEMM, one
// warp per token: s = sigmoid(logits) (1/(1 + expf(−x)), torch's CUDA formula), c = s + bias, group scores (top-2 sums),
// keep topk_groups groups, top-k of c, weights = s at those experts, / (Σ + 1e-20), × scale, all fp32; optionally the
// per-expert loads (slots routed to each expert) added on the device for the aux-loss-free bias update. Backward
// recomputes s from the logits at the selected experts.
//
// Same order and tie rule as the CPU: groups and experts by descending value, equal values to the lower index, NaN
// first; slots by descending biased score; Σ in slot order. The only difference from the CPU is expf (CUDA's ≤ 2 ulp,
// glibc's < 1 ulp), so ids agree except at fp32 near-ties and weights to a few ulp.
// Limits: E ≤ 1024, 1 ≤ top_k ≤ 32, plus check_sigmoid_group_routing's (groups divide E, ...). Asynchronous on
// `stream`; nothing here waits for the device.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cpu/router_sigmoid_group.h"
#include "kernels/cuda/router.h"

namespace mt::cuda {

using SigmoidGroupRouting = cpu::SigmoidGroupRouting;

// logits F32|BF16 [T, E] on a CUDA device; correction_bias F32 [E] on the same device, or undefined (zeros).
// When expert_load is given (I32 [E] on the same device), this call's slot counts are added to it.
// -> index I32 [T, k], weights F32 [T, k] (fp32 in a bf16 model too, as HF).
RouterResult router_sigmoid_group_forward(const Tensor& logits, const Tensor& correction_bias,
                                          const SigmoidGroupRouting& r, Tensor* expert_load, cudaStream_t stream);

// dweights F32 [T, k] -> dlogits [T, E] (F32|BF16, allocated by the caller, overwritten): through the scale, the
// normalisation, the gather and sigmoid' = (1 − s)·s with s recomputed from `logits` at route.index; zero on every
// unselected expert. Indices outside [0, E) (a caller bug; not checked without a sync) are clamped.
void router_sigmoid_group_backward(const Tensor& dweights, const Tensor& logits, const RouterResult& route,
                                   const SigmoidGroupRouting& r, Tensor& dlogits, cudaStream_t stream);

// load[e] += number of slots of index (I32 [T, k]) holding e; load I32 [E]; both on one CUDA device. Indices outside
// [0, E) are skipped (a caller bug; not checked without a sync).
void router_expert_load_add(const Tensor& index, Tensor& load, cudaStream_t stream);

}  // namespace mt::cuda
