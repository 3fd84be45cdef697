#include "train/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt {

double tensor_grad_norm(const Tensor& g) { return norm_of_sumsq(tensor_grad_sumsq(g)); }

double tensor_grad_sumsq(const Tensor& g) {
  MT_CHECK(g.dtype() == DType::F32 && g.device().is_cpu(), "grad_global_norm: expects F32 CPU gradients");
  const float* p = g.data_as<float>();
  const int64_t n = g.numel();
  // Fixed blocks summed in order: the result does not depend on the thread count or timing, so a
  // resumed run clips exactly as an uninterrupted one.
  constexpr int64_t kBlock = 1 << 14;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    double s = 0;
    for (int64_t i = b * kBlock, e = std::min(n, i + kBlock); i < e; ++i) s += static_cast<double>(p[i]) * p[i];
    partial[static_cast<size_t>(b)] = s;
  }
  double sq = 0;
  for (double s : partial) sq += s;
  return sq;
}

// torch rounds each tensor's norm to fp32 before the norm of norms.
double norm_of_sumsq(double sumsq) { return static_cast<float>(std::sqrt(sumsq)); }

double norm_of_norms(const std::vector<double>& norms) {
  double total_sq = 0;
  for (double norm : norms) total_sq += norm * norm;
  return std::sqrt(total_sq);
}

double grad_global_norm(const std::vector<Tensor*>& grads) {
  std::vector<double> norms;
  norms.reserve(grads.size());
  for (Tensor* g : grads) {
    MT_CHECK(g, "grad_global_norm: null gradient");
    norms.push_back(tensor_grad_norm(*g));
  }
  return norm_of_norms(norms);
}

double grad_clip_to(const std::vector<Tensor*>& grads, double total_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const float coef = static_cast<float>(std::min(1.0, max_norm / (total_norm + 1e-6)));
  if (coef == 1.0f) return 1.0;  // torch multiplies by 1.0: no change
  for (Tensor* g : grads) {
    float* p = g->data_as<float>();
    const int64_t n = g->numel();
#pragma omp parallel for if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) p[i] *= coef;
  }
  return coef;
}

}  // namespace mt
