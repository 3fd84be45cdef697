#include "kernels/cpu/swiglu.h"

#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

void swiglu_forward_rows(int64_t rows, int64_t F, const float* g, const float* u, int64_t ld_in, float* a,
                         int64_t ld_out, bool bf16) {
#pragma omp parallel for schedule(static) if ((rows * F) >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < F; ++i) {
      const float x = g[r * ld_in + i];
      const float s = x / (1.0f + std::exp(-x));
      a[r * ld_out + i] = bf16 ? round_bf16(round_bf16(s) * u[r * ld_in + i]) : s * u[r * ld_in + i];
    }
  }
}

void swiglu_backward_rows(int64_t rows, int64_t F, const float* da, int64_t ld_da, const float* g, const float* u,
                          int64_t ld_in, float* dg, float* du, int64_t ld_out) {
#pragma omp parallel for schedule(static) if ((rows * F) >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < F; ++i) {
      const float x = g[r * ld_in + i];
      const float sig = 1.0f / (1.0f + std::exp(-x));
      const float d = da[r * ld_da + i];
      du[r * ld_out + i] = d * x * sig;
      // silu'(x) = sig·(1 + x·(1 − sig))
      dg[r * ld_out + i] = d * u[r * ld_in + i] * sig * (1.0f + x * (1.0f - sig));
    }
  }
}

Tensor swiglu_forward(const Tensor& g, const Tensor& u, bool bf16) {
  MT_CHECK(g.ndim() >= 1, "swiglu input {}", g.desc());
  check_f32(g, "swiglu gate", g.shape());
  check_f32(u, "swiglu up", g.shape());
  const int64_t F = g.dim(-1), rows = F == 0 ? 0 : g.numel() / F;
  Tensor a = Tensor::empty(g.shape(), DType::F32);
  swiglu_forward_rows(rows, F, g.data_as<float>(), u.data_as<float>(), F, a.data_as<float>(), F, bf16);
  return a;
}

void swiglu_backward(const Tensor& da, const Tensor& g, const Tensor& u, Tensor& dg, Tensor& du) {
  check_f32(g, "swiglu gate", g.shape());
  check_f32(u, "swiglu up", g.shape());
  check_f32(da, "swiglu da", g.shape());
  const int64_t F = g.dim(-1), rows = F == 0 ? 0 : g.numel() / F;
  dg = Tensor::empty(g.shape(), DType::F32);
  du = Tensor::empty(g.shape(), DType::F32);
  swiglu_backward_rows(rows, F, da.data_as<float>(), F, g.data_as<float>(), u.data_as<float>(), F,
                       dg.data_as<float>(), du.data_as<float>(), F);
}

}  // namespace mt::cpu
