// ReLU² activation (Transformers' ACT2FN["relu2"], ReLUSquaredActivation: square(relu(u))), Nemotron-H's MLPs and
// experts: a = relu(u)², da/du = 2·relu(u).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::cpu {

// u F32 [..., F] -> a F32. bf16: the square rounded once (relu is exact).
Tensor relu2_forward(const Tensor& u, bool bf16);
// da, u F32 of one shape -> du (allocated here).
Tensor relu2_backward(const Tensor& da, const Tensor& u);

// Raw forms over rows with strides (the experts' grouped buffers).
void relu2_forward_rows(int64_t rows, int64_t F, const float* u, int64_t ld_in, float* a, int64_t ld_out, bool bf16);
void relu2_backward_rows(int64_t rows, int64_t F, const float* da, int64_t ld_da, const float* u, int64_t ld_in,
                         float* du, int64_t ld_out);

}  // namespace mt::cpu
