// Pre-norm Mamba2 mixer block (Nemotron-H's `M` layers: NemotronHMamba2Mixer.torch_forward in Transformers 5.17,
// hf-numerics.md §6.2), over a spec's Mamba2Spec:
//   n = input_norm(x);  z | xBC | dt = in_proj(n)                         (d_inner | d_inner + 2·groups·state | heads)
//   xBC = silu(conv1d(xBC) + conv_bias);  xs | B | C = xBC              (causal depthwise: kernels/cpu/conv1d_causal.h)
//   dt = max(softplus(dt + dt_bias), time_step_min);  A = −exp(A_log)
//   y = SSD(xs, dt, A, B, C) + D·xs                                       (fp32, chunked: kernels/cpu/ssd_scan.h)
//   y = x + out_proj(gated_rmsnorm(y, z))                                 (fp32 norm per group: rmsnorm_gated.h)
// In bf16 the rounding points are Transformers' torch path's: in_proj's output, the conv's output, silu, the dt +
// dt_bias add and the softplus (its dt is bf16), the gated norm's fp32 result before out_proj, out_proj and the
// residual add; the scan and the norm run in fp32.
//
// Packed documents: the conv window and the scan state restart at every document (env.doc_ids). Transformers' torch
// path ignores position_ids here and lets a document read its predecessors (tests/fixtures/README.md: max |Δlogits|
// 8.1 on the fixture), so there is no Transformers reference for packed batches; with
// ModelOptions::packed_document_mask off (no doc_ids) a row is one sequence, as Transformers runs it.
#pragma once
#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"

namespace mt {

struct Mamba2BlockActs {
  Tensor n;       // [T, H]         normalised input
  Tensor z;       // [T, Di]        the gate (in_proj's first Di outputs)
  Tensor xbc;     // [T, C]         the conv's input
  Tensor conv;    // [T, C]         the conv's output, before silu
  Tensor dt_raw;  // [T, heads]     dt + dt_bias, before softplus
  Tensor dt;      // [T, heads]     after softplus and the clamp
  Tensor x, B, C; // [T, heads, P], [T, groups, N] x 2: silu(conv) split
  Tensor A;       // [heads]        −exp(A_log), fp32
  Tensor y;       // [T, heads, P]  the scan's output (D skip included), fp32
  Tensor g;       // [T, Di]        the gated norm's output as out_proj reads it (bf16-rounded in bf16)
};

// x F32 [T, H] -> y F32 [T, H]. acts may be null (forward only). final_state (optional; one sequence: batch 1, no
// doc_ids): the scan's state after the last token, F32 [heads, head_dim, state] (ssd_scan.h's chunked final state).
// lora (optional): the layer's adapters on in_proj and out_proj (kernels/cpu/lora.h; the cached block runs merged
// weights and passes none).
Tensor mamba2_block_forward(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& x,
                            Mamba2BlockActs* acts, Tensor* final_state = nullptr, const LayerLora* lora = nullptr);

// The row-wise pieces of the forward, shared with the cached block (mamba2_mixer_block_cached.h).
// input_norm and in_proj over the rows of x: s.n, s.z and s.xbc; returns the dt columns before the bias, [T, heads].
Tensor mamba2_project_rows(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& x,
                           Mamba2BlockActs& s, const LayerLora* lora = nullptr);
// From the conv's output s.conv [T, C]: silu and the split into s.x, s.B, s.C; s.dt_raw and s.dt from dt_in; s.A.
void mamba2_conv_activations(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& dt_in,
                             Mamba2BlockActs& s);
// dy [T, H] -> dx [T, H] (including the residual); parameter gradients added into g (an undefined gradient tensor is
// a frozen parameter: not computed); the adapters' (lora as in the forward) into dlora.
Tensor mamba2_block_backward(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& x,
                             const Mamba2BlockActs& acts, const Tensor& dy, LayerWeights& g,
                             const LayerLora* lora = nullptr, LayerLora* dlora = nullptr);

}  // namespace mt
