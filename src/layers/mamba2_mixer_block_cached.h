// The Mamba2 mixer block of mamba2_mixer_block.h for generation (Nemotron-H). What it keeps does not grow with the
// sequence: the conv's window (its last K−1 inputs, the rows of xBC) and the SSM state S [heads, head_dim, state].
//
// Prefill (offset 0) is the training block itself over the prompt — Transformers' chunked scan with the same ops and
// bf16 rounding points, so the prompt's logits are the full forward's — and keeps what Transformers' torch path hands
// its cache: the chunked form's final state (new_states[:, -1], fp32) and the prompt's last K−1 conv inputs (zeros
// before the first token, as its left pad). Every later row advances the state by one token, as the decode branch of
// NemotronHMamba2Mixer.torch_forward (Transformers 5.17: cache_params with a previous state, seq_len 1) does:
//   xBC, z, dt = in_proj(input_norm(x))                                  (the training block's rows)
//   conv = Σ_j w_j · window_j + b, window_{K−1} = this row's xBC        (taps summed in order, the bias last)
//   xs | B | C = silu(conv);  dt = max(softplus(dt + dt_bias), time_step_min)        (the training block's)
//   S = S · exp(dt·A) + (dt·B) ⊗ xs;   y = S·C + D·xs                    (per head, B and C of its group; S fp32)
//   out = x + out_proj(gated_rmsnorm(y, z))
// fp32 model: this is the recurrence of ssd_scan.h's sequential form, so a step's logits equal the full forward's up
// to fp32 rounding (the chunked scan associates the same sums differently; the conv is bit for bit the same).
// bf16 model: Transformers' decode branch rounds where its chunked prefill does not, and this block rounds where the
// decode branch does: each tap product w_j·window_j (bf16 · bf16), their sum, the bias add; dt·B and (dt·B)·xs; the
// state (kept fp32) cast to bf16 before S·C, whose sum is rounded; D·xs and y + D·xs; in the gated norm, whose input
// y is then bf16, the normalised value and its product with the weight (rmsnorm_gated.h's bf16_input). So a bf16
// decode step gives Transformers' decode numbers, a few bf16 ulps from what the full forward gives that position.
// Several rows at offset > 0 (Generator::extend with more than one id) advance one token at a time the same way.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/model_weights.h"

namespace mt {

// What one Mamba2 sublayer keeps between decode steps, F32, whatever the sequence length.
struct Mamba2Cache {
  Tensor conv;  // F32 [conv_dim, conv_kernel − 1]: the conv's last K−1 inputs, oldest first (bf16 values in bf16)
  Tensor ssm;   // F32 [heads, head_dim, state]

  // Zero-filled for Mamba2 configuration `spec` (an empty window and state: before the first token).
  static Mamba2Cache create(const Mamba2Spec& spec);
  int64_t bytes() const;
};

// x F32 [n, H] at positions offset..offset+n-1 -> y F32 [n, H]; offset 0 starts the sequence (the cache's previous
// contents are ignored), offset > 0 continues from the cache. Batch 1, no packed documents.
Tensor mamba2_block_forward_cached(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w,
                                   const Tensor& x, int64_t offset, Mamba2Cache& cache);

}  // namespace mt
