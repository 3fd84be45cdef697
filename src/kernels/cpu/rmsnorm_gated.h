// The gated RMSNorm of Mamba2's output (Transformers' Zamba2RMSNormGated with norm_before_gate=False, as
// NemotronHMamba2Mixer uses it), in fp32 whatever the model dtype:
//   t = y ⊙ silu(z);   per group of `group` consecutive channels: out = w ⊙ t · rsqrt(mean(t²) + eps)
// (the weight multiplies the fp32 normalised value: its product stays fp32, hf-numerics.md §6.2).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::cpu {

// y, z F32 [..., n] (n a multiple of group), w F32|BF16 [n] -> out F32 [..., n].
// bf16_input: y is a bf16 tensor (Transformers' one-token decode step, whose scan output is bf16): the module casts
// the normalised value back to the input dtype before the weight multiplies it, so it is rounded to bf16 there, and
// so is the product (bf16 weight · bf16 value). Off (the training forward's fp32 scan output): both stay fp32.
Tensor rmsnorm_gated_forward(const Tensor& y, const Tensor& z, const Tensor& w, int64_t group, float eps,
                             bool bf16_input = false);
// dout F32 [..., n] -> dy, dz (allocated here); dw F32 [n] += Σ_rows dout ⊙ t·rstd (undefined: a frozen weight).
void rmsnorm_gated_backward(const Tensor& dout, const Tensor& y, const Tensor& z, const Tensor& w, int64_t group,
                            float eps, Tensor& dy, Tensor& dz, Tensor& dw);

}  // namespace mt::cpu
