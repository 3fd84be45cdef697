// Final norm, LM head and causal-LM cross-entropy. Logits are produced in row chunks so a training
// step never holds the full [T, V] logits (only forward with want_logits does).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "layers/block_env.h"

namespace mt {

struct LmHeadOutput {
  double ce_sum = 0.0;  // Σ over valid shifted targets (fp32 logits; bf16 values in bf16 mode)
  int64_t count = 0;    // valid targets
  Tensor logits;        // F32 [T, V] when requested
};

// x F32 [T, H] (last decoder output), final_norm [H], head [V, H] (lm_head or the tied embedding),
// targets I64 [T] shifted (cpu::causal_lm_targets) or undefined (no loss).
LmHeadOutput lm_head_forward(const BlockEnv& env, const Tensor& final_norm, const Tensor& head, const Tensor& x,
                             const Tensor& targets, bool want_logits);

// Forward and backward together: d(loss)/d(ce_sum) = scale. Returns dx [T, H]; gradients are added
// into dfinal_norm [H] and dhead [V, H] (F32; an undefined one is frozen and not computed). `out` receives ce_sum and count.
Tensor lm_head_forward_backward(const BlockEnv& env, const Tensor& final_norm, const Tensor& head, const Tensor& x,
                                const Tensor& targets, float scale, Tensor& dfinal_norm, Tensor& dhead,
                                LmHeadOutput* out);

}  // namespace mt
