#include "kernels/cpu/residual.h"

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

Tensor residual_add(const Tensor& x, const Tensor& y, bool bf16) {
  check_f32(x, "residual x", x.shape());
  check_f32(y, "residual y", x.shape());
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  const float* a = x.data_as<float>();
  const float* b = y.data_as<float>();
  float* o = out.data_as<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) o[i] = bf16 ? round_bf16(a[i] + b[i]) : a[i] + b[i];
  return out;
}

void add_inplace(Tensor& acc, const Tensor& y) {
  check_f32(acc, "accumulator", acc.shape());
  check_f32(y, "addend", acc.shape());
  float* a = acc.data_as<float>();
  const float* b = y.data_as<float>();
  const int64_t n = acc.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace mt::cpu
