// Dense MLP block: n = post_norm(h); y = h + down(silu(gate n) ⊙ up n) (SwiGLU, Transformers' Qwen3MLP), or
// y = h + down(relu(up n)²) (ReLU², no gate: NemotronHMLP).
#pragma once
#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"

namespace mt {

struct MlpBlockActs {
  Tensor n;        // [T, H]
  Tensor gate, up; // [T, F] (gate: SwiGLU only)
  Tensor act;      // [T, F] silu(gate) ⊙ up, or relu(up)²
};

// lora (optional): adapters on gate/up/down.
Tensor mlp_block_forward(const BlockEnv& env, const MlpSpec& spec, const LayerWeights& w, const Tensor& h,
                         MlpBlockActs* acts, const LayerLora* lora = nullptr);
// dy [T, H] -> dh [T, H] (including the residual); parameter gradients added into g (undefined ones: frozen, not
// computed); with lora, the adapters' gradients into dlora.
Tensor mlp_block_backward(const BlockEnv& env, const MlpSpec& spec, const LayerWeights& w, const Tensor& h,
                          const MlpBlockActs& acts, const Tensor& dy, LayerWeights& g, const LayerLora* lora = nullptr,
                          LayerLora* dlora = nullptr);

}  // namespace mt
