// Causal grouped-query attention of new queries against a KV cache (generation): the n queries sit at
// positions offset..offset+n-1, the cache holds keys/values for positions 0..offset+n-1 (the new ones
// already appended), and query r sees keys 0..offset+r. Prefill is offset = 0, a decode step n = 1.
// Numerics are those of attention_forward (hf-numerics.md §1.1): scale D^-0.5, fp32 scores and
// softmax (max-subtracted, sum in double), bf16 mode rounds the probabilities before P·V and the output.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::cpu {

struct AttentionDecodeShape {
  int64_t offset = 0;  // position of the first query
  int64_t queries = 0; // n
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t v_dim = 0;         // head size of the values and the output; 0: head_dim (MLA: its v_head_dim)
  int64_t window = 0;        // > 0: query at position p sees keys p − window + 1 .. p only
  float scale = 0.0f;        // 0: head_dim^-1/2
  bool eager_bf16 = false;   // bf16 rounds as Transformers' eager attention (AttentionShape::eager_bf16)
};

// q F32 [n, heads, D]; k_cache F32 [capacity, kv_heads, D], v_cache F32 [capacity, kv_heads, Dv] with capacity >=
// offset + n (rows past offset + n are not read). Returns out F32 [n, heads, Dv].
// sinks F32|BF16 [heads] or undefined: each head's sink logit joins the softmax (attention.h).
Tensor attention_decode_forward(const AttentionDecodeShape& s, const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, bool bf16, const Tensor& sinks = Tensor());

}  // namespace mt::cpu
