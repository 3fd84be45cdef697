// The attention blocks' costs (see block_cost.h): GQA's CUDA twin is layers/cuda/attention_block_cuda.h; MLA has none
// yet and is estimated in attention_cost.cpp.
#pragma once
#include <cstdint>

#include "layers/costs/block_cost.h"

namespace mt {

// AttentionActsCuda: a (the normalised input), q, k, v, qr and kr (after QK-norm and RoPE), o, lse (F32 [Hq, T]);
// selective recompute drops a, qr and kr. Backward: d(o), flash's fp32 dQ/dK/dV sums and delta, dq, dk, dv, the
// gradients after RoPE and before the QK-norm, da.
// MLA (DeepSeek-V3) has no CUDA block yet: its bytes are those the CPU block keeps, in bf16 (an estimate).
BlockBytes attention_bytes(const AttentionSpec& a, int64_t hidden, const BlockBatch& b);
// q, k, v and o projections (MLA: its five projections), plus the causal scores and weighted values (half of the
// full S x S square; a sliding window caps each query's keys).
double attention_flops_per_token(const AttentionSpec& a, int64_t hidden, int64_t seq);
// The RoPE cos and sin tables (F32, rotated dims / 2 per token) a batch carries for this configuration; 0 without
// RoPE.
CostBytes attention_rope_table_bytes(const AttentionSpec& a, int64_t tokens);

}  // namespace mt
