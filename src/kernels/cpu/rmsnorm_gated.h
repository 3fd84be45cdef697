// The gated RMSNorm of Mamba2's output (Transformers' Zamba2RMSNormGated with norm_before_gate=False, as
// NemotronHMamba2Mixer uses it), in fp32 whatever the model dtype:
//   t = y ⊙ silu(z);   per group of `group` consecutive channels: out = w ⊙ t · rsqrt(mean(t²) + eps)
// (the weight multiplies the fp32 normalised value: its product stays fp32, hf-numerics.md §6.2).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::cpu {

// y, z F32 [..., n] (n a multiple of group), w F32|BF16 [n] -> out F32 [..., n].
Tensor rmsnorm_gated_forward(const Tensor& y, const Tensor& z, const Tensor& w, int64_t group, float eps);
// dout F32 [..., n] -> dy, dz (allocated here); dw F32 [n] += Σ_rows dout ⊙ t·rstd (undefined: a frozen weight).
void rmsnorm_gated_backward(const Tensor& dout, const Tensor& y, const Tensor& z, const Tensor& w, int64_t group,
                            float eps, Tensor& dy, Tensor& dz, Tensor& dw);

}  // namespace mt::cpu
