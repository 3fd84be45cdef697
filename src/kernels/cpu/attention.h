// Causal grouped-query attention, scale D^-0.5 (or given), optionally restricted to packed documents, to a sliding
// window of keys, and with a learned per-head sink logit (GPT-OSS, hf-numerics.md §4.2: an extra softmax column
// whose probability is dropped, so each row's weights sum to 1 − p_sink).
// Query head h reads key/value head h / (heads / kv_heads), as repeat_kv / enable_gqa do.
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t v_dim = 0;    // head size of the values and the output; 0: head_dim (MLA: 128 values vs 192 qk)
  int64_t window = 0;   // > 0: query i sees keys j > i − window only (Transformers' sliding mask)
  float scale = 0.0f;   // 0: head_dim^-1/2
  // bf16 as Transformers' eager attention rounds (GPT-OSS): bf16(bf16(q·k)·scale) scores, bf16(score − max), a
  // bf16 softmax; otherwise (sdpa) fp32 scores and softmax with the probabilities rounded.
  bool eager_bf16 = false;
};

// q F32 [B, S, heads, D], k F32 [B, S, kv_heads, D], v F32 [B, S, kv_heads, Dv]; doc I32 [B, S] or undefined: key
// j is visible to query i iff j <= i and doc[j] == doc[i]. Returns out F32 [B, S, heads, Dv] and fills lse F32
// [B, heads, S] (log-sum-exp of each score row, kept so backward can recompute the probabilities).
// bf16 (sdpa in bf16): scores and softmax in fp32, probabilities rounded to bf16 before P·V, output rounded.
// sinks F32|BF16 [heads] or undefined (no sink column); lse then includes the sink.
Tensor attention_forward(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& doc, bool bf16, Tensor& lse, const Tensor& sinks = Tensor());

// dout like out -> dq, dk, dv (overwritten, shaped as q, k, v). Recomputes P from q, k and lse; fp32 math (in bf16 mode
// the rounded P is used for dV, as the forward multiplied it with V).
// With sinks, dsinks F32 [heads] += d(loss)/d(sink) (= −Σ_rows p_sink · Σ_j P_ij·dP_ij: the sink column's value
// vector is zero); dsinks null: frozen sinks, not computed.
void attention_backward(const AttentionShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& doc, const Tensor& lse, bool bf16, Tensor& dq, Tensor& dk,
                        Tensor& dv, const Tensor& sinks = Tensor(), Tensor* dsinks = nullptr);

}  // namespace mt::cpu
