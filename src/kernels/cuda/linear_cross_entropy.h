// Chunked fused LM head + cross-entropy: for each chunk of `chunk_rows` tokens,
//   logits [C, V] = x_c · Wᵀ (GEMM; bf16 output when x/W are bf16, as HF's lm_head),
//   fp32 log-softmax per row, loss_t = logsumexp(z_t) − z_t[y_t] for y_t ≠ −100,
//   dlogits = grad_scale · (softmax − onehot) written over the logits (rounded to their dtype),
//   dx_c = dlogits · W (overwritten), dW += dlogitsᵀ · x_c (fp32, accumulating).
// Only one [C, V] buffer exists at a time; [T, V] is never materialised. No host synchronisation.
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

struct LinearCrossEntropyArgs {
  int64_t chunk_rows = 1024;
  float grad_scale = 1.0f;  // d(loss)/d(loss_sum), e.g. 1 / num_items_in_batch
  bool compute_grad = true; // false: loss only (evaluation); dx/dw untouched
};

// x [T, H] (BF16|F32), w [V, H] same dtype, targets I64|I32 [T] (already shifted; −100 ignored; values
// outside [0, V) are validated on the host by causal_lm_targets and are ignored here).
// loss_sum F32 [1] and count I32 [1] are overwritten (Σ over valid rows in a fixed order; count of valid rows).
// dx [T, H] (x's dtype) is overwritten and dw F32 [V, H] accumulated when compute_grad (dw null: a frozen head,
// its gradient GEMM skipped).
void linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, const LinearCrossEntropyArgs& args,
                          Tensor& loss_sum, Tensor& count, Tensor* dx, Tensor* dw, cudaStream_t stream);

}  // namespace mt::cuda
