// The Mamba2 mixer block on the GPU (CPU twin: layers/mamba2_mixer_block.h, Nemotron-H's `M` layers), given its
// Mamba2Spec; n is the normalised input (the norm before the block, input_norm, is the caller's, fused with the
// residual add as for every other block):
//   proj = in_proj(n) [+ b] [+ LoRA]                BF16 [T, Di + C + heads]: z | xBC | dt, one GEMM
//   act  = silu(conv1d(xBC) + conv_bias)            BF16 [T, C], read from proj's columns (kernels/cuda/conv1d_causal.h)
//   dt   = max(softplus(dt + dt_bias), time_step_min), A = −exp(A_log)          (kernels/cuda/mamba2_dt.h)
//   y    = SSD(x, dt, A, B, C) + D·x                F32 [T, Di], x | B | C = act's columns (kernels/cuda/ssd_scan.h)
//   g    = gated_rmsnorm(y, z)                      BF16 [T, Di] (kernels/cuda/rmsnorm_gated.h)
//   out  = out_proj(g) [+ b]                        BF16 [T, H], before the residual add (the next norm fuses it)
// LoRA (env.lora on mamba_in_proj): the adapter is added onto the base output (kernels/cuda/lora.h), as in every other
// CUDA block and in the CPU twin (cpu::lora_linear_forward). out_proj takes none: its target is refused before any
// table is built (PEFT refuses it: families/nemotron_h.cpp).
// The bf16 rounding points are the CPU block's (Transformers' torch path); the scan and the gated norm run in fp32.
// Packed documents restart the conv window and the scan state (env.batch->docs), as on the CPU.
// Recompute: act, dt, A and g are cheap elementwise/conv work over proj and y and may be dropped after the forward
// (selective); proj (a GEMM, the adapter's part included) and y (the scan) are kept, and so are the scan's chunk
// states when the kernel keeps them, and the adapter's u (r values a token: cheaper kept than recomputed; the
// restored n is the forward's bits, so u_in still matches it).
#pragma once
#include "core/tensor.h"
#include "layers/cuda/cuda_block_env.h"
#include "models/model_weights.h"
#include "models/spec/decoder_spec.h"

namespace mt {

struct Mamba2ActsCuda {
  Tensor n;       // [T, H]             normalised block input (the caller's norm output)
  Tensor proj;    // [T, Di + C + nh]   in_proj's output
  Tensor act;     // [T, C]             silu(conv(xBC)): x | B | C
  Tensor dt;      // F32 [T, nh]        the time steps after softplus and the clamp
  Tensor A;       // F32 [nh]           −exp(A_log)
  Tensor y;       // F32 [T, Di]        the scan's output (D skip included)
  Tensor states;  // F32                the scan's chunk states for its backward (ssd_scan_states_numel), or none
  Tensor g;       // [T, Di]            the gated norm's output, out_proj's input
  // LoRA: the in_proj adapter's u = bf16(n·A'ᵀ), BF16 [T, r], kept for its backward; undefined without an adapter.
  Tensor u_in;
};

// n BF16 [T, H] (kept in acts) -> BF16 [T, H]. T may be 0.
Tensor mamba2_block_forward_cuda(const CudaBlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w,
                                 const Tensor& n, Mamba2ActsCuda& acts);
// Drops n, act, dt, A and g (u_in stays).
void mamba2_acts_drop_cheap(Mamba2ActsCuda& acts);
// Recomputes what mamba2_acts_drop_cheap dropped (n from the block input x with the layer's input_norm).
void mamba2_acts_restore(const CudaBlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& x,
                         Mamba2ActsCuda& acts);
// dy BF16 [T, H] -> dn BF16 [T, H] (the gradient of n; the norm's backward is the caller's); parameter gradients
// (F32) added into g; an undefined one is a frozen parameter (LoRA) and is not computed. The adapter's gradients go
// to env.dlora.
Tensor mamba2_block_backward_cuda(const CudaBlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w,
                                  const Mamba2ActsCuda& acts, const Tensor& dy, LayerWeights& g);

}  // namespace mt
