#include "kernels/cpu/relu2.h"

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

void relu2_forward_rows(int64_t rows, int64_t F, const float* u, int64_t ld_in, float* a, int64_t ld_out, bool bf16) {
#pragma omp parallel for schedule(static) if ((rows * F) >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < F; ++i) {
      const float x = u[r * ld_in + i] > 0.0f ? u[r * ld_in + i] : 0.0f;
      a[r * ld_out + i] = bf16 ? round_bf16(x * x) : x * x;
    }
}

void relu2_backward_rows(int64_t rows, int64_t F, const float* da, int64_t ld_da, const float* u, int64_t ld_in,
                         float* du, int64_t ld_out) {
#pragma omp parallel for schedule(static) if ((rows * F) >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < F; ++i) {
      const float x = u[r * ld_in + i];
      du[r * ld_out + i] = x > 0.0f ? 2.0f * x * da[r * ld_da + i] : 0.0f;
    }
}

Tensor relu2_forward(const Tensor& u, bool bf16) {
  MT_CHECK(u.ndim() >= 1, "relu2 input {}", u.desc());
  check_f32(u, "relu2 input", u.shape());
  const int64_t F = u.dim(-1), rows = F == 0 ? 0 : u.numel() / F;
  Tensor a = Tensor::empty(u.shape(), DType::F32);
  relu2_forward_rows(rows, F, u.data_as<float>(), F, a.data_as<float>(), F, bf16);
  return a;
}

Tensor relu2_backward(const Tensor& da, const Tensor& u) {
  check_f32(u, "relu2 input", u.shape());
  check_f32(da, "relu2 da", u.shape());
  const int64_t F = u.dim(-1), rows = F == 0 ? 0 : u.numel() / F;
  Tensor du = Tensor::empty(u.shape(), DType::F32);
  relu2_backward_rows(rows, F, da.data_as<float>(), F, u.data_as<float>(), F, du.data_as<float>(), F);
  return du;
}

}  // namespace mt::cpu
