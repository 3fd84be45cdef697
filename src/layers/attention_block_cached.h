// The attention block of attention_block.h for generation: the n rows of x sit at positions
// offset..offset+n-1 (env.rope holds their tables), their keys and values (after QK-norm and RoPE)
// are written into rows [offset, offset+n) of this sublayer's cache, and each query attends to every
// cached key up to its own position. Same ops and bf16 rounding points as attention_block_forward.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/model_weights.h"

namespace mt {

// What one GQA attention sublayer keeps between decode steps: the keys after QK-norm and RoPE (what attention
// reads) and the values, in F32 (bf16-representable values for a BF16 model, so nothing is lost).
struct AttentionCache {
  Tensor k;  // F32 [capacity, kv_heads, head_dim]
  Tensor v;  // F32 [capacity, kv_heads, value_dim]

  // Zero-filled for `capacity` positions of attention `spec` (GQA).
  static AttentionCache create(const AttentionSpec& spec, int64_t capacity);
  int64_t bytes() const { return k.defined() ? static_cast<int64_t>(k.nbytes() + v.nbytes()) : 0; }
};

// x F32 [n, H]; cache rows >= offset + n -> y F32 [n, H].
Tensor attention_block_forward_cached(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                      const Tensor& x, int64_t offset, AttentionCache& cache);

}  // namespace mt
