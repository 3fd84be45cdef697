// Causal grouped-query attention, scale D^-0.5, optionally restricted to packed documents.
// Query head h reads key/value head h / (heads / kv_heads), as repeat_kv / enable_gqa do.
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
};

// q F32 [B, S, heads, D], k, v F32 [B, S, kv_heads, D]; doc I32 [B, S] or undefined: key j is visible
// to query i iff j <= i and doc[j] == doc[i]. Returns out F32 [B, S, heads, D] and fills lse F32
// [B, heads, S] (log-sum-exp of each score row, kept so backward can recompute the probabilities).
// bf16 (sdpa in bf16): scores and softmax in fp32, probabilities rounded to bf16 before P·V, output rounded.
Tensor attention_forward(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& doc, bool bf16, Tensor& lse);

// dout like out -> dq, dk, dv (overwritten). Recomputes P from q, k and lse; fp32 math (in bf16 mode
// the rounded P is used for dV, as the forward multiplied it with V).
void attention_backward(const AttentionShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& doc, const Tensor& lse, bool bf16, Tensor& dq, Tensor& dk,
                        Tensor& dv);

}  // namespace mt::cpu
