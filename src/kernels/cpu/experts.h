// Routed SwiGLU experts over a token -> expert assignment (Qwen3MoeExperts, grouped_mm dataflow):
//   for each (token t, slot s): e = index[t, s], y = down_e( silu(gate_e x_t) ⊙ up_e x_t )
//   out[t] = Σ_s weights[t, s] · y          (bf16: bf16(y·w) per slot, summed in fp32, rounded once)
// Slots are grouped by expert (a counting sort, stable in slot order) and each expert runs two sgemms
// over its rows; experts that received no tokens are skipped.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace mt::cpu {

struct ExpertsSaved {
  std::vector<int64_t> offsets;  // [E + 1]: grouped rows of expert e are [offsets[e], offsets[e+1])
  std::vector<int32_t> slot;     // [N = T·k]: grouped row -> flat slot t·k + s
  std::vector<int32_t> row;      // [N]: flat slot -> grouped row
  Tensor xg;                     // F32 [N, H] gathered inputs
  Tensor gate_up;                // F32 [N, 2I] gate | up projections (pre-activation)
  Tensor act;                    // F32 [N, I]  silu(gate) ⊙ up
  Tensor y;                      // F32 [N, H]  expert outputs before the routing weight
};

// x F32 [T, H], index I32 [T, k] (values checked in [0, E)), weights F32 [T, k],
// gate_up F32|BF16 [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up), down F32|BF16 [E, H, I] -> out F32 [T, H].
// `saved` (optional) receives what backward needs.
Tensor experts_forward(const Tensor& x, const Tensor& index, const Tensor& weights, const Tensor& gate_up,
                       const Tensor& down, bool bf16, ExpertsSaved* saved);

// dout F32 [T, H] -> dx F32 [T, H] and dweights F32 [T, k] (both allocated here);
// dgate_up F32 [E, 2I, H] and ddown F32 [E, H, I] are accumulated. fp32 math on the saved activations.
void experts_backward(const Tensor& dout, const Tensor& weights, const Tensor& gate_up, const Tensor& down,
                      const ExpertsSaved& saved, Tensor& dx, Tensor& dweights, Tensor& dgate_up, Tensor& ddown);

}  // namespace mt::cpu
