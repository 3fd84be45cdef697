#include "kernels/cpu/rmsnorm_gated.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

namespace {
struct GatedDims {
  int64_t n, rows;
};

GatedDims gated_dims(const Tensor& y, const Tensor& z, const Tensor& w, int64_t group) {
  MT_CHECK(w.ndim() == 1 && y.ndim() >= 1 && y.dim(-1) == w.dim(0), "gated rmsnorm input {} weight {}", y.desc(),
           w.desc());
  const int64_t n = w.dim(0);
  MT_CHECK(group >= 1 && n % group == 0, "gated rmsnorm: {} channels in groups of {}", n, group);
  check_f32(y, "gated rmsnorm input", y.shape());
  check_f32(z, "gated rmsnorm gate", y.shape());
  return {n, n == 0 ? 0 : y.numel() / n};
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// The gated values of one row and each group's rsqrt(mean(t²) + eps) (the sum of squares in double).
void gate_row(const float* y, const float* z, int64_t n, int64_t group, float eps, float* t, float* rstd) {
  for (int64_t i = 0; i < n; ++i) t[i] = y[i] * silu(z[i]);
  for (int64_t g = 0; g < n / group; ++g) {
    double s = 0.0;
    for (int64_t i = g * group; i < (g + 1) * group; ++i) s += static_cast<double>(t[i]) * t[i];
    rstd[g] = 1.0f / std::sqrt(static_cast<float>(s / static_cast<double>(group)) + eps);
  }
}
}  // namespace

Tensor rmsnorm_gated_forward(const Tensor& y, const Tensor& z, const Tensor& w, int64_t group, float eps,
                             bool bf16_input) {
  const GatedDims d = gated_dims(y, z, w, group);
  const int64_t n = d.n;
  const Tensor wf = param_f32(w);
  const float* yp = y.data_as<float>();
  const float* zp = z.data_as<float>();
  const float* wp = wf.data_as<float>();
  Tensor out = Tensor::empty(y.shape(), DType::F32);
  float* op = out.data_as<float>();
#pragma omp parallel for schedule(static) if ((d.rows * n) >= kParallelMinWork)
  for (int64_t r = 0; r < d.rows; ++r) {
    std::vector<float> t(static_cast<size_t>(n)), rstd(static_cast<size_t>(n / group));
    gate_row(yp + r * n, zp + r * n, n, group, eps, t.data(), rstd.data());
    if (bf16_input)
      for (int64_t i = 0; i < n; ++i) op[r * n + i] = round_bf16(wp[i] * round_bf16(t[i] * rstd[i / group]));
    else
      for (int64_t i = 0; i < n; ++i) op[r * n + i] = wp[i] * (t[i] * rstd[i / group]);
  }
  return out;
}

void rmsnorm_gated_backward(const Tensor& dout, const Tensor& y, const Tensor& z, const Tensor& w, int64_t group,
                            float eps, Tensor& dy, Tensor& dz, Tensor& dw) {
  const GatedDims d = gated_dims(y, z, w, group);
  const int64_t n = d.n, G = n / group;
  check_f32(dout, "gated rmsnorm dout", y.shape());
  if (dw.defined()) check_f32(dw, "gated rmsnorm dw", {n});
  const Tensor wf = param_f32(w);
  const float* yp = y.data_as<float>();
  const float* zp = z.data_as<float>();
  const float* wp = wf.data_as<float>();
  const float* gp = dout.data_as<float>();
  dy = Tensor::empty(y.shape(), DType::F32);
  dz = Tensor::empty(y.shape(), DType::F32);
  float* dyp = dy.data_as<float>();
  float* dzp = dz.data_as<float>();
  // The normalised values u = t·rstd, kept for dw.
  Tensor u = Tensor::empty(y.shape(), DType::F32);
  float* up = u.data_as<float>();
#pragma omp parallel for schedule(static) if ((d.rows * n) >= kParallelMinWork)
  for (int64_t r = 0; r < d.rows; ++r) {
    std::vector<float> t(static_cast<size_t>(n)), rstd(static_cast<size_t>(G));
    const float* yr = yp + r * n;
    const float* zr = zp + r * n;
    const float* gr = gp + r * n;
    gate_row(yr, zr, n, group, eps, t.data(), rstd.data());
    for (int64_t g = 0; g < G; ++g) {
      const float rs = rstd[g];
      // dt = rs · (du − u · mean(du ⊙ u)), du = dout ⊙ w
      double dot = 0.0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        up[r * n + i] = t[i] * rs;
        dot += static_cast<double>(gr[i] * wp[i]) * up[r * n + i];
      }
      const float m = static_cast<float>(dot / static_cast<double>(group));
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        const float dt = rs * (gr[i] * wp[i] - up[r * n + i] * m);
        const float sig = 1.0f / (1.0f + std::exp(-zr[i]));
        dyp[r * n + i] = dt * zr[i] * sig;
        // silu'(z) = sig·(1 + z·(1 − sig))
        dzp[r * n + i] = dt * yr[i] * sig * (1.0f + zr[i] * (1.0f - sig));
      }
    }
  }
  if (!dw.defined()) return;
  float* dwp = dw.data_as<float>();
#pragma omp parallel for schedule(static) if ((d.rows * n) >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (int64_t r = 0; r < d.rows; ++r) s += static_cast<double>(gp[r * n + i]) * up[r * n + i];
    dwp[i] += static_cast<float>(s);
  }
}

}  // namespace mt::cpu
