// The grouped-query attention block on the GPU (CPU twin: layers/attention_block.h), given its sublayer spec (heads,
// head dims, options; its RoPE table is the batch's for that spec, CudaBatch::rope_table):
//   a = input_norm(x); q = rope([q_norm](q_proj a [+ bq])); k = rope([k_norm](k_proj a [+ bk])); v = v_proj a [+ bv]
//   y = o_proj(flash_attention(q, k, v [, sinks, window, scale])) [+ bo]   (the residual add is fused into the next
//   norm). QK-norm: Qwen3; biases, sinks and sliding windows: GPT-OSS. Without RoPE (RopeKind::none, Nemotron-H's
//   NoPE attention) there is no rotation and no table: qr, kr are the QK-norm's outputs, or q, k themselves without
//   one.
// Tensors the backward needs live in AttentionActsCuda; the cheap ones (a, qr, kr) may be dropped
// after the forward and recomputed (selective recompute).
#pragma once
#include "core/tensor.h"
#include "layers/cuda/cuda_block_env.h"
#include "models/model_weights.h"

namespace mt {

struct AttentionActsCuda {
  Tensor a;       // [T, H]       normalised block input
  Tensor q, k;    // [T, Hq·D], [T, Hkv·D] projections (with their biases) before the QK-norm
  Tensor qr, kr;  // after the QK-norm (where the spec has it) and RoPE (where it has one); else q, k
  Tensor v;       // [T, Hkv·D]
  Tensor o;       // [T, Hq·D] attention output
  Tensor lse;     // F32 [Hq, T]
  // LoRA (env.lora): each adapted projection's u = bf16(input·A'ᵀ), BF16 [T, r], kept for its backward.
  Tensor uq, uk, uv, uo;
};

// a (the normalised input, kept in acts) -> y BF16 [T, H], before the residual add.
Tensor attention_block_forward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                    const Tensor& a, AttentionActsCuda& acts);
// Drops a, qr, kr (recomputable from the block input and q, k).
void attention_acts_drop_cheap(AttentionActsCuda& acts);
// Recomputes what attention_acts_drop_cheap dropped; x is the block input.
void attention_acts_restore(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                            const Tensor& x, AttentionActsCuda& acts);
// The q/k/v projections' weight gradients, held back by attention_block_backward_cuda.
struct AttentionWgradsCuda {
  Tensor a, dq, dk, dv;  // dq/dk/dv undefined: that projection is frozen
  bool bias = false;  // the projections have biases: their gradients too
};

// dy BF16 [T, H] (gradient of y) -> da BF16 [T, H] (gradient of the normalised input a); parameter
// gradients (F32) are added into g (q/k/v/o projections and biases, q/k norms, sinks); an undefined one is a
// frozen parameter (LoRA) and is not computed. The adapters' gradients go to env.dlora. The input norm's backward is the
// caller's (it fuses the residual gradient). With `deferred`, the q/k/v weight gradients (da does not
// need them) are left for attention_block_wgrads_cuda, so the caller can queue work that waits for da
// first (the next expert-parallel exchange) and run them under it.
Tensor attention_block_backward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                     const AttentionActsCuda& acts, const Tensor& dy, LayerWeights& g,
                                     AttentionWgradsCuda* deferred = nullptr);
void attention_block_wgrads_cuda(const CudaBlockEnv& env, AttentionWgradsCuda& d, LayerWeights& g);

}  // namespace mt
