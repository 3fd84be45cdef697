// A dense MLP block on the GPU (CPU twin: layers/mlp_block.h), described by explicit inputs so any
// architecture can use it (Qwen3's dense layers, Qwen3-MoE's mlp_only_layers, DeepSeek-V3's first dense layers and
// shared experts, Nemotron-H's MLP layers and shared experts):
//   SwiGLU: gu = [n·W_gateᵀ | n·W_upᵀ]  two GEMMs into the halves of one [T, 2F] buffer (bf16, one rounding each)
//           h  = bf16(bf16(silu(gate)) · up)   HF's two roundings
//   ReLU²:  gu = n·W_upᵀ                 one GEMM, [T, F] (no gate weight)
//           h  = bf16(relu(up)²)         one rounding (kernels/cuda/relu2.h)
//   y  = h·W_downᵀ               (bf16; the residual add is fused into the next norm by the caller)
// n is the normalised input (the norm before the block belongs to the caller, as for the MoE block).
// Reads no model config: only the env's stream, device and phase timer, and the dims given here.
// Recompute: n and h are cheap (a norm, an elementwise op) and may be dropped after the forward; the
// GEMM outputs gu are kept. Every GEMM sums in a fixed order (no atomics), so runs repeat bit for bit.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "layers/cuda/cuda_block_env.h"
#include "models/model_weights.h"
#include "models/spec/decoder_spec.h"

namespace mt {

// The block's dims (a DecoderSpec's MlpSpec plus the hidden size). SwiGLU or ReLU² (up and down only); GPT-OSS's
// clamped SwiGLU has no dense MLP to serve.
struct MlpDimsCuda {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // F
  Activation activation = Activation::swiglu;
};

// BF16 parameters on the device, HF's nn.Linear layout [out, in], and the weight slots (WeightSlot) whose LoRA
// adapters (env.lora) they take: a dense layer's mlp_*, a shared expert's shared_*.
struct MlpWeightsCuda {
  const Tensor& gate;  // [F, H]; undefined for ReLU² (no gate)
  const Tensor& up;    // [F, H]
  const Tensor& down;  // [H, F]
  int slot_gate = WeightSlot::mlp_gate, slot_up = WeightSlot::mlp_up, slot_down = WeightSlot::mlp_down;
};

// F32 gradients on the device, shaped like the weights; the backward adds into them (beta 1), like every
// other block's parameter gradients, so micro-batches accumulate. (A const MlpGradsCuda still writes them.)
// An undefined one is a frozen weight (LoRA): its GEMM is skipped.
struct MlpGradsCuda {
  Tensor& gate;  // not read for ReLU²
  Tensor& up;
  Tensor& down;
};

struct MlpActsCuda {
  Tensor n;   // [T, H]  block input (normalised)
  Tensor gu;  // [T, 2F] gate | up GEMM outputs (SwiGLU), [T, F] up (ReLU²)
  Tensor h;   // [T, F]  activation output, the down GEMM's input
  // LoRA (env.lora on mlp_gate / mlp_up / mlp_down): each adapter's u = bf16(input·A'ᵀ) [T, r], kept.
  Tensor u_gate, u_up, u_down;  // u_gate: SwiGLU only
};

// n BF16 [T, H] (kept in acts) -> y BF16 [T, H]. T may be 0.
Tensor mlp_block_forward_cuda(const CudaBlockEnv& env, const MlpDimsCuda& spec, const MlpWeightsCuda& w, const Tensor& n,
                              MlpActsCuda& acts);
void mlp_acts_drop_cheap(MlpActsCuda& acts);  // drops n and h
// Recomputes h from gu if it was dropped. n is the caller's to restore (it owns the norm before the block).
void mlp_acts_restore(const CudaBlockEnv& env, const MlpDimsCuda& spec, MlpActsCuda& acts);
// dy BF16 [T, H] (gradient of y) -> dn BF16 [T, H] (gradient of n); the weight gradients are added into g.
// acts must be complete (after mlp_acts_restore, with n set). dn_into (optional, BF16 [T, H]): dn is added into it
// (its GEMMs accumulate there: a shared expert's gradient joining the routed experts') and it is returned.
Tensor mlp_block_backward_cuda(const CudaBlockEnv& env, const MlpDimsCuda& spec, const MlpWeightsCuda& w,
                               const MlpActsCuda& acts, const Tensor& dy, const MlpGradsCuda& g,
                               Tensor* dn_into = nullptr);

}  // namespace mt
