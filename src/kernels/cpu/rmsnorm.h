// RMSNorm over the last dimension (Qwen3RMSNorm): y = x·rsqrt(mean(x²) + eps), out = w ⊙ y.
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

// x F32 [..., n], w F32|BF16 [n] -> F32 [..., n].
// bf16: out = bf16(w · bf16(y)) (the normalised value is rounded first, then the bf16 product).
Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, bool bf16);

// dy, x F32 [..., n] -> dx (returned); dw F32 [n] += Σ_rows dy ⊙ y.
// fp32 math on the saved input in both modes (y recomputed without the bf16 roundings).
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, Tensor& dw);

}  // namespace mt::cpu
