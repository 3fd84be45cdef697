#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

namespace {
// rsqrt(mean(x²) + eps) in fp32 as torch does; the sum itself is accumulated in double (fixed order).
float row_rstd(const float* x, int64_t n, float eps) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  const float var = static_cast<float>(s / static_cast<double>(n));
  return 1.0f / std::sqrt(var + eps);
}
}  // namespace

Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, bool bf16, bool bf16_round_once) {
  MT_CHECK(w.ndim() == 1, "rmsnorm weight must be 1-d, got {}", w.desc());
  const int64_t n = w.dim(0);
  MT_CHECK(x.ndim() >= 1 && x.dim(-1) == n, "rmsnorm input {} does not match weight {}", x.desc(), w.desc());
  check_f32_numel(x, "rmsnorm input", x.numel());
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  Tensor wf = param_f32(w);
  const float* xp = x.data_as<float>();
  const float* wp = wf.data_as<float>();
  float* op = out.data_as<float>();
#pragma omp parallel for schedule(static) if ((rows * n) >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * n;
    float* orow = op + r * n;
    const float rstd = row_rstd(xr, n, eps);
    for (int64_t i = 0; i < n; ++i) {
      const float y = xr[i] * rstd;
      orow[i] = !bf16 ? wp[i] * y : bf16_round_once ? round_bf16(wp[i] * y) : round_bf16(wp[i] * round_bf16(y));
    }
  }
  return out;
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, Tensor& dw) {
  const int64_t n = w.dim(0);
  check_f32_numel(x, "rmsnorm x", x.numel());
  check_f32_numel(dy, "rmsnorm dy", x.numel());
  if (dw.defined()) check_f32(dw, "rmsnorm dw", {n});
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor dx = Tensor::empty(x.shape(), DType::F32);
  Tensor wf = param_f32(w);
  const float* xp = x.data_as<float>();
  const float* gp = dy.data_as<float>();
  const float* wp = wf.data_as<float>();
  float* dxp = dx.data_as<float>();
  std::vector<float> rstd(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static) if ((rows * n) >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * n;
    const float* gr = gp + r * n;
    const float rs = row_rstd(xr, n, eps);
    rstd[r] = rs;
    // dx = rstd · (g - y · mean(g ⊙ y)), g = dy ⊙ w
    double dot = 0.0;
    for (int64_t i = 0; i < n; ++i) dot += static_cast<double>(gr[i] * wp[i]) * (xr[i] * rs);
    const float m = static_cast<float>(dot / static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i) dxp[r * n + i] = rs * (gr[i] * wp[i] - xr[i] * rs * m);
  }
  if (!dw.defined()) return dx;  // a frozen norm weight
  // dw: column sums in a fixed row order (no dependence on the thread count).
  float* dwp = dw.data_as<float>();
#pragma omp parallel for schedule(static) if ((rows * n) >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (int64_t r = 0; r < rows; ++r) s += static_cast<double>(gp[r * n + i]) * (xp[r * n + i] * rstd[r]);
    dwp[i] += static_cast<float>(s);
  }
  return dx;
}

}  // namespace mt::cpu
