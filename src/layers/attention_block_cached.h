// The attention block of attention_block.h for generation: the n rows of x sit at positions
// offset..offset+n-1 (env.rope holds their tables), their keys and values (after QK-norm and RoPE)
// are written into rows [offset, offset+n) of this layer's cache, and each query attends to every
// cached key up to its own position. Same ops and bf16 rounding points as attention_block_forward.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/model_weights.h"

namespace mt {

// x F32 [n, H]; k_cache, v_cache F32 [capacity, kv_heads, D], capacity >= offset + n -> y F32 [n, H].
Tensor attention_block_forward_cached(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                      const Tensor& x, int64_t offset, Tensor& k_cache, Tensor& v_cache);

}  // namespace mt
