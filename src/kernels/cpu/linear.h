// nn.Linear without bias: y = x·Wᵀ, W stored [out, in].
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

// x F32 [N, in], w F32|BF16 [out, in] -> y F32 [N, out]. bf16: y rounded to bf16 (fp32 accumulate,
// as a bf16 cuBLAS GEMM). x may have any shape whose last dim is `in`; y keeps the leading dims.
Tensor linear_forward(const Tensor& x, const Tensor& w, bool bf16);

// dy F32 [N, out], x F32 [N, in], w [out, in].
// dx (if non-null): overwritten with dy·W, shape of x.  dw (if non-null): F32 [out, in], dw += dyᵀ·x.
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw);

}  // namespace mt::cpu
