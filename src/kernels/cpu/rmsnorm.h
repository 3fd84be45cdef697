// RMSNorm over the last dimension (Qwen3RMSNorm): y = x·rsqrt(mean(x²) + eps), out = w ⊙ y.
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

// x F32 [..., n], w F32|BF16 [n] -> F32 [..., n].
// bf16: out = bf16(w · bf16(y)) (the normalised value is rounded first, then the bf16 product), or with
// bf16_round_once out = bf16(w · y) (GPT-OSS's RMSNorm: the product in fp32, one rounding; hf-numerics.md §1.1).
Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, bool bf16, bool bf16_round_once = false);

// dy, x F32 [..., n] -> dx (returned); dw F32 [n] += Σ_rows dy ⊙ y (dw undefined: a frozen weight, skipped).
// fp32 math on the saved input in both modes (y recomputed without the bf16 roundings).
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, Tensor& dw);

}  // namespace mt::cpu
