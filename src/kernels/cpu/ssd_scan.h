// Mamba2's selective state-space scan (SSD), per segment of tokens (kernels/cpu/seq_segments.h) and per head h of
// `heads` (B and C shared by the heads of group g = h / (heads / groups)), state S_h [head_dim, state] zero at the
// segment's start:
//   S_t = exp(dt_t·A_h) · S_{t−1} + dt_t · x_t ⊗ B_t          y_t = S_t · C_t + D_h · x_t
// in fp32 whatever the model dtype (hf-numerics.md §6.2).
//
// Two forms with one contract:
// * sequential: the recurrence above, token by token (the reference the chunked form and the CUDA kernels are held
//   to). Its backward keeps every S_t.
// * chunked: NemotronHMamba2Mixer.torch_forward's SSD (Transformers 5.17), in its order: x·dt and A·dt; per chunk of
//   `chunk` tokens the cumulative sums of A·dt, the intra-chunk term Y_diag = ((C·Bᵀ) ⊙ exp(segsum)) · (x·dt), the
//   chunk's own end state Σ_l B_l·exp(cs_last − cs_l)·(x·dt)_l, the states entering each chunk as
//   Σ_{c ≤ z} exp(segsum of the chunk totals)_{z,c} · state_c (the (chunks+1)² matrix form, not a running product),
//   Y_off = (C · S_in) · exp(cs), y = Y_diag + Y_off, then + D·x. The cumulative sums accumulate in double and round
//   each output to fp32 (torch's CPU cumsum); a partial last chunk runs on its real tokens (Transformers' zero padding
//   adds exact zeros). Its backward is the exact reverse of these steps.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/seq_segments.h"

namespace mt::cpu {

struct SsdShape {
  int64_t heads = 0, head_dim = 0;  // P = head_dim channels per head
  int64_t groups = 0, state = 0;    // N = state; groups divides heads
  int64_t chunk = 0;                // chunked form only (>= 1)
};

// Inputs (all F32, on the CPU): x [T, heads, P], dt [T, heads] (after softplus and clamp), A [heads] (negative),
// B and C [T, groups, N], D [heads].
struct SsdInputs {
  Tensor x, dt, A, B, C, D;
};

// Gradients of a loss through y (allocated by the backward): shaped like the inputs.
struct SsdGrads {
  Tensor dx, ddt, dA, dB, dC, dD;
};

// -> y F32 [T, heads, P].
Tensor ssd_scan_sequential_forward(const SsdShape& s, const SsdInputs& in, const std::vector<SeqSegment>& segs);
SsdGrads ssd_scan_sequential_backward(const SsdShape& s, const SsdInputs& in, const Tensor& dy,
                                      const std::vector<SeqSegment>& segs);

// final_state (optional, one segment only): the state after the segment's last token, F32 [heads, P, N], as the
// chunked form has it (Transformers' new_states[:, -1], the ssm_state its torch path hands to the decode cache:
// Σ_z exp(segsum of the chunk totals)_{last,z} · state_z).
Tensor ssd_scan_chunked_forward(const SsdShape& s, const SsdInputs& in, const std::vector<SeqSegment>& segs,
                                Tensor* final_state = nullptr);
SsdGrads ssd_scan_chunked_backward(const SsdShape& s, const SsdInputs& in, const Tensor& dy,
                                   const std::vector<SeqSegment>& segs);

}  // namespace mt::cpu
