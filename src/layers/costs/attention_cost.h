// The attention blocks' costs (CUDA twins: layers/cuda/attention_block_cuda.h for GQA,
// layers/cuda/mla_attention_block_cuda.h for MLA; see block_cost.h).
#pragma once
#include <cstdint>

#include "layers/costs/block_cost.h"

namespace mt {

// AttentionActsCuda: a (the normalised input), q, k, v, qr and kr (after QK-norm and RoPE), o, lse (F32 [Hq, T]);
// selective recompute drops a, qr and kr. Backward: d(o), flash's fp32 dQ/dK/dV sums and delta, dq, dk, dv, the
// gradients after RoPE and before the QK-norm, da.
// MLA (DeepSeek-V3): qa (q LoRA), q, ckv, kv, o, lse kept; a, the latent norms' outputs, the latent's copy and the
// assembled query, key and value cheap. Backward: d(o), the flash fp32 sums, the assembly's gradients, the
// projections' input gradients.
BlockBytes attention_bytes(const AttentionSpec& a, int64_t hidden, const BlockBatch& b);
// q, k, v and o projections (MLA: its five projections), plus the causal scores and weighted values (half of the
// full S x S square; a sliding window caps each query's keys).
double attention_flops_per_token(const AttentionSpec& a, int64_t hidden, int64_t seq);
// The value head size flash attention runs an MLA spec at: v_head_dim where the kernels take (head_dim,
// v_head_dim) (DeepSeek-V3's 192 / 128), else head_dim with the value zero-padded (any head_dim the kernels have,
// v_head_dim <= head_dim); 0 when neither.
int64_t mla_flash_value_dim(const AttentionSpec& a);
// The RoPE cos and sin tables (F32, rotated dims / 2 per token) a batch carries for this configuration; 0 without
// RoPE.
CostBytes attention_rope_table_bytes(const AttentionSpec& a, int64_t tokens);

}  // namespace mt
