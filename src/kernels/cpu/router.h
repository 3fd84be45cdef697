// Top-k router of Qwen3-MoE (Qwen3MoeTopKRouter after its linear): softmax (fp32) -> top-k ->
// optional renormalisation (fp32, no epsilon) -> routing weights (bf16-rounded in bf16 mode).
// Ties in top-k go to the lower expert index first (torch.topk on the CPU does the same; CUDA's
// order for exact ties is not documented).
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

struct RouterOutput {
  Tensor probs;    // F32 [T, E] softmax of the logits
  Tensor index;    // I32 [T, k] selected experts, by descending probability
  Tensor value;    // F32 [T, k] selected probabilities after the optional renormalisation (unrounded)
  Tensor weights;  // F32 [T, k] routing weights used by the experts (= value, bf16-rounded in bf16 mode)
};

// logits F32 [T, E] (bf16 values in bf16 mode) -> routing.
RouterOutput router_forward(const Tensor& logits, int64_t top_k, bool norm_topk_prob, bool bf16);

// dweights F32 [T, k] = d(loss)/d(weights) -> d(loss)/d(logits) F32 [T, E] (through the renormalisation,
// the top-k gather and the softmax; the indices carry no gradient).
Tensor router_backward(const Tensor& dweights, const RouterOutput& r, bool norm_topk_prob);

// GPT-OSS's router (GptOssTopKRouter after its biased linear, hf-numerics.md §4.2): top-k of the logits
// themselves, then softmax over those k values (fp32; weights bf16-rounded in bf16 mode). `probs` holds the softmax
// over all E (what a load-balancing statistic reads); `value` the unrounded k-way softmax.
RouterOutput router_topk_softmax_forward(const Tensor& logits, int64_t top_k, bool bf16);
// dweights F32 [T, k] -> d(loss)/d(logits) F32 [T, E], nonzero on the selected experts only.
Tensor router_topk_softmax_backward(const Tensor& dweights, const RouterOutput& r);

// Shared by the aux loss: softmax of each row in fp32 (bf16: output rounded), and top-k of a row.
void softmax_rows_f32(const float* x, int64_t rows, int64_t n, float* out, bool round_out);
void topk_row(const float* p, int64_t n, int64_t k, int32_t* idx);

}  // namespace mt::cpu
