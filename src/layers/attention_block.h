// Pre-norm GQA self-attention block with QK-norm and half-split RoPE (Qwen3, hf-numerics.md §2), or with q/k/v/o
// biases, per-head sinks, a sliding window and YaRN RoPE without QK-norm (GPT-OSS, §4.2), or without any positional
// encoding (Nemotron-H, §6.2: q and k as projected):
//   a = input_norm(x); q = rope(q_norm(q_proj a)); k = rope(k_norm(k_proj a)); v = v_proj a
//   y = x + o_proj(attention(q, k, v))
// The block input x is kept by the caller; the intermediates live in AttentionBlockActs so a caller
// may drop them and recompute by running the forward again.
#pragma once
#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"

namespace mt {

struct AttentionBlockActs {
  Tensor a;        // [T, H]        normalised input
  Tensor q, k;     // [T, heads*D], [T, kv*D] projections before QK-norm
  Tensor qr, kr;   // [B, S, heads, D], [B, S, kv, D] after QK-norm and RoPE
  Tensor v;        // [B, S, kv, D]
  Tensor o;        // [B, S, heads, D] attention output
  Tensor lse;      // [B, heads, S]
};

// x F32 [T, H] -> y F32 [T, H]. acts may be null (forward only). lora (optional): adapters on q/k/v/o_proj.
Tensor attention_block_forward(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Tensor& x,
                               AttentionBlockActs* acts, const LayerLora* lora = nullptr);
// dy [T, H] -> dx [T, H] (including the residual path); parameter gradients added into g (an undefined gradient
// tensor is a frozen parameter: not computed); with lora, the adapters' gradients into dlora.
Tensor attention_block_backward(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Tensor& x,
                                const AttentionBlockActs& acts, const Tensor& dy, LayerWeights& g,
                                const LayerLora* lora = nullptr, LayerLora* dlora = nullptr);

}  // namespace mt
