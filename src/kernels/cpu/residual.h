// Residual connection: out = x + y (bf16 mode: the sum of two bf16 tensors, rounded).
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

// x, y F32 of the same shape -> x + y.
Tensor residual_add(const Tensor& x, const Tensor& y, bool bf16);
// acc F32 += y (gradient accumulation; same shape).
void add_inplace(Tensor& acc, const Tensor& y);

}  // namespace mt::cpu
