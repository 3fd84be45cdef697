// nn.Linear: y = x·Wᵀ (+ b), W stored [out, in].
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

// x F32 [N, in], w F32|BF16 [out, in] -> y F32 [N, out]. bf16: y rounded to bf16 (fp32 accumulate,
// as a bf16 cuBLAS GEMM). x may have any shape whose last dim is `in`; y keeps the leading dims.
Tensor linear_forward(const Tensor& x, const Tensor& w, bool bf16);
// With a bias b F32|BF16 [out] (undefined: none): bf16 rounds once, after the add, as cuBLAS's addmm does.
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, bool bf16);
// db F32 [out] += Σ over rows of dy [..., out]; nothing when db is undefined (a frozen bias).
void bias_backward(const Tensor& dy, Tensor& db);

// dy F32 [N, out], x F32 [N, in], w [out, in].
// dx (if non-null): overwritten with dy·W, shape of x.  dw (if non-null): F32 [out, in], dw += dyᵀ·x.
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw);

}  // namespace mt::cpu
