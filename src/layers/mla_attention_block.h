// Pre-norm multi-head latent attention block (DeepSeek-V3's DeepseekV3Attention, hf-numerics.md §5.2):
//   a = input_norm(x)
//   q = q_b_proj(q_a_norm(q_a_proj a))      (or q = q_proj a without a q LoRA)   -> [T, heads, nope + rope]
//   c = kv_a_proj_with_mqa a -> [kv latent | k_rot]  (kv_lora_rank, qk_rope_head_dim)
//   kv = kv_b_proj(kv_a_norm(kv latent))    -> [T, heads, nope + v] = [k_nope | v]
//   query = [q_nope | rope(q_rot)],  key = [k_nope | rope(k_rot) on every head]
//   y = x + o_proj(attention(query, key, v))          (scale: the spec's, qk_head_dim^-1/2 · mscale²)
// RoPE acts on the rope dims only (interleaved pairs, de-interleaved output, or the half split), from the
// batch's table for this spec. The latent norms use eps 1e-6 (their class default, whatever rms_norm_eps is).
// bf16: every projection, norm, RoPE op rounds as Transformers' bf16 ops do; the assembly of query and key is
// exact; attention as sdpa (fp32 scores and softmax, probabilities and output rounded).
#pragma once
#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"

namespace mt {

// DeepseekV3RMSNorm(q_lora_rank) / (kv_lora_rank) are built without eps=config.rms_norm_eps.
constexpr float kMlaLatentNormEps = 1e-6f;

struct MlaBlockActs {
  Tensor a;            // [T, H]              normalised input
  Tensor qa, qan;      // [T, q_lora]          q latent before and after q_a_layernorm (q LoRA only)
  Tensor q;            // [T, heads*(nope+rope)] query projection, before RoPE
  Tensor ckv;          // [T, kv_lora + rope]  kv_a_proj_with_mqa output
  Tensor kv_lat, kvn;  // [T, kv_lora]         the kv latent before and after kv_a_layernorm
  Tensor kv;           // [T, heads*(nope+v)]  kv_b_proj output: k_nope | v per head
  Tensor query, key;   // [B, S, heads, nope+rope] as attention reads them
  Tensor value;        // [B, S, heads, v]
  Tensor o;            // [B, S, heads, v]     attention output
  Tensor lse;          // [B, heads, S]
};

// x F32 [T, H] -> y F32 [T, H]. acts may be null (forward only). lora (optional): adapters on q_proj / q_a_proj /
// q_b_proj / kv_a_proj_with_mqa / kv_b_proj / o_proj.
Tensor mla_attention_block_forward(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                   const Tensor& x, MlaBlockActs* acts, const LayerLora* lora = nullptr);
// The row-by-row part of the block, shared with the cached block (mla_attention_block_cached.h) so both compute the
// same numbers: fills acts.a, qa, qan, q, ckv, kv_lat, kvn and query ([B, S, heads, nope+rope], RoPE applied) and
// returns the shared rope key after RoPE, F32 [T, qk_rope_head_dim].
Tensor mla_project_rows(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Tensor& x,
                        MlaBlockActs& acts, const LayerLora* lora = nullptr);
// Per-head keys and values of R positions from kv_b_proj's output kv (R·heads·(nope+v) values) and their rope keys
// k_rot [R, rope]: key F32 [R, heads, nope+rope] = [k_nope | k_rot on every head], value F32 [R, heads, v].
void mla_keys_values(const AttentionSpec& spec, const Tensor& kv, const Tensor& k_rot, Tensor& key, Tensor& value);

// dy [T, H] -> dx [T, H] (including the residual path); parameter gradients added into g (an undefined gradient
// tensor is a frozen parameter: not computed); with lora, the adapters' gradients into dlora.
Tensor mla_attention_block_backward(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                    const Tensor& x, const MlaBlockActs& acts, const Tensor& dy, LayerWeights& g,
                                    const LayerLora* lora = nullptr, LayerLora* dlora = nullptr);

}  // namespace mt
