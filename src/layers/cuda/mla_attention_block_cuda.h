// DeepSeek-V3's multi-head latent attention block on the GPU (CPU twin: layers/mla_attention_block.h, whose header
// states the math; hf-numerics.md §5.2), given its sublayer spec (AttentionKind::mla):
//   q   = q_b_proj(q_a_norm(q_a_proj a))   or q_proj a without a q LoRA rank           [T, heads·(nope + rope)]
//   ckv = kv_a_proj_with_mqa a = [kv latent | k_rot]                                    [T, kv_lora + rope]
//   kv  = kv_b_proj(kv_a_norm(kv latent)) = [k_nope | v] per head                       [T, heads·(nope + Dv)]
//   query, key, value = kernels/cuda/mla_assemble.h (RoPE on the rope columns of q and of the one k_rot, k_rot on
//   every head); o = flash_attention(query, key, value) (the spec's scale); y = o_proj o   (the residual add is
//   fused into the next norm by the caller, as for the GQA block)
// The latent norms use eps 1e-6 (kMlaLatentNormEps) and the model's two bf16 roundings. Flash attention runs MLA's
// qk 192 / v 128 natively (mma.sync; the Hopper backward has no 192/128 kernel), and any other (qk, Dv) with qk a head
// size of the kernels and Dv <= qk through a zero-padded value (mla_value_pad; the tiny test shapes).
// LoRA: adapters on q_proj, q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj and o_proj (env.lora), as on the
// CPU. Selective recompute drops a, the latent norm outputs, the latent's copy and the assembled query, key and
// value, recomputed from the kept projections (qa, q, ckv, kv); o and lse are kept.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "layers/cuda/cuda_block_env.h"
#include "models/model_weights.h"

namespace mt {

struct MlaActsCuda {
  Tensor a;            // [T, H]                 normalised block input (cheap)
  Tensor qa, qan;      // [T, q_lora]             q latent (kept) and after q_a_layernorm (cheap); q LoRA rank only
  Tensor q;            // [T, heads·D]            query projection, before RoPE (kept)
  Tensor ckv;          // [T, kv_lora + rope]     kv_a_proj_with_mqa's output (kept)
  Tensor kv_lat, kvn;  // [T, kv_lora]            ckv's latent columns and after kv_a_layernorm (cheap)
  Tensor kv;           // [T, heads·(nope + Dv)]  kv_b_proj's output (kept)
  Tensor query, key;   // [T, heads, D]           as flash attention reads them (cheap)
  Tensor value;        // [T, heads, Dvp]         Dv value columns, zero-padded to Dvp (cheap)
  Tensor o;            // [T, heads, Dvp]         attention output (kept)
  Tensor o_flat;       // [T, heads·Dv]           o without its padding, o_proj's input (kept; = o when Dvp = Dv)
  Tensor lse;          // F32 [heads, T]
  // LoRA (env.lora): each adapted projection's u = bf16(input·A'ᵀ), BF16 [T, r], kept for its backward.
  Tensor uq, uqa, uqb, ukva, ukvb, uo;
};

// The value head size flash attention runs this spec at: Dv where the kernels take (qk, Dv), else qk (padded);
// 0 when neither works (mla_cuda_unsupported_reason says why).
int64_t mla_value_pad(const AttentionSpec& spec);
// Why the GPU cannot run this MLA spec ("" when it can): head sizes the flash kernels lack, odd rope dims.
std::string mla_cuda_unsupported_reason(const AttentionSpec& spec);

// a (the normalised input, kept in acts) -> y BF16 [T, H], before the residual add.
Tensor mla_attention_block_forward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                        const Tensor& a, MlaActsCuda& acts);
// Drops the cheap tensors (a, qan, kv_lat, kvn, query, key, value).
void mla_acts_drop_cheap(MlaActsCuda& acts);
// Recomputes what mla_acts_drop_cheap dropped; x is the block input (before input_norm).
void mla_acts_restore(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Tensor& x,
                      MlaActsCuda& acts);
// dy BF16 [T, H] -> da BF16 [T, H] (the gradient of the normalised input; the input norm's backward is the
// caller's). Parameter gradients (F32) are added into g (the six projections, q_a_norm, kv_a_norm); an undefined one
// is a frozen parameter (LoRA), not computed. The adapters' gradients go to env.dlora.
Tensor mla_attention_block_backward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                         const MlaActsCuda& acts, const Tensor& dy, LayerWeights& g);

}  // namespace mt
