// Causal-LM cross-entropy as Transformers' ForCausalLMLoss (hf-numerics.md §1.4): labels are shifted
// inside (target[t] = labels[t+1], the last position of each row ignored), -100 is ignored, and the
// loss is the SUM over valid targets (the caller divides by num_items_in_batch or the count).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::cpu {

// labels I64 [B, S] (values must be in [0, V) or -100, checked) -> shifted targets I64 [B·S].
Tensor causal_lm_targets(const Tensor& labels, int64_t vocab);

struct CrossEntropyResult {
  double loss_sum = 0.0;  // Σ_valid logsumexp(z_t) − z_t[y_t], accumulated in double
  int64_t count = 0;      // number of valid targets
};

// logits F32 [N, V] (fp32, or bf16 values upcast), targets I64 [N] (-100 ignored).
CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& targets);
// dlogits F32 [N, V] (overwritten) = scale · (softmax(z_t) − onehot(y_t)) on valid rows, 0 on ignored rows.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, float scale, Tensor& dlogits);

}  // namespace mt::cpu
