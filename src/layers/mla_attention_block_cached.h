// The multi-head latent attention block of mla_attention_block.h for generation (DeepSeek-V3). What it caches is
// what MLA compresses keys and values into, per position: the kv latent after kv_a_layernorm (kv_lora_rank values,
// what kv_b_proj reads) and the shared rope key after RoPE (qk_rope_head_dim values) — not per-head keys and
// values, which would take heads × (nope + rope + v) values a position (128 × 320 against 576 on DeepSeek-V3).
//
// The n rows of x sit at positions offset..offset+n-1 (env.rope holds their tables). They run the training block's
// own row-by-row code (mla_project_rows: the query with its RoPE, the latent, the rope key), their latent and rope
// key go into rows [offset, offset + n) of the cache, then every step expands the whole cached latent through
// kv_b_proj into per-head k_nope and v and attends over it, each query seeing the positions up to its own.
// NOTE: this is the plain formulation, not the absorbed one (kv_b's key half folded into the query, its value half
// into the output, attention over the latent directly). Expanding runs exactly the training forward's ops —
// kv_b_proj on the same bf16-rounded latent, the same key/value assembly, the same attention numerics — so the
// logits equal the full forward's up to fp32 summation order; the absorbed form reassociates q·W_kᵀ·c and rounds
// in other places under bf16. Its cost is a kv_b_proj over all cached positions each step (O(length) work,
// which the CPU reference engine can afford).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/model_weights.h"

namespace mt {

// What one MLA sublayer keeps between decode steps, F32 (bf16-representable values in a BF16 model).
struct MlaCache {
  Tensor latent;  // F32 [capacity, kv_lora_rank]     kv_a_layernorm(kv latent)
  Tensor k_rot;   // F32 [capacity, qk_rope_head_dim] the rope key after RoPE, shared by every head

  // Zero-filled for `capacity` positions of attention `spec` (MLA).
  static MlaCache create(const AttentionSpec& spec, int64_t capacity);
  int64_t bytes() const;
};

// x F32 [n, H]; cache rows >= offset + n -> y F32 [n, H].
Tensor mla_attention_block_forward_cached(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                          const Tensor& x, int64_t offset, MlaCache& cache);

}  // namespace mt
