#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

namespace {
constexpr int64_t kIgnore = -100;

// logsumexp of one row, fp32 max and a double sum of exp (fixed order).
float row_lse(const float* z, int64_t V) {
  float m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = std::max(m, z[i]);
  double s = 0.0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(static_cast<double>(z[i] - m));
  return m + static_cast<float>(std::log(s));
}

void check_targets(const Tensor& logits, const Tensor& targets) {
  MT_CHECK(logits.ndim() == 2, "cross-entropy logits must be [N, V], got {}", logits.desc());
  check_f32(logits, "cross-entropy logits", logits.shape());
  MT_CHECK(targets.dtype() == DType::I64 && targets.numel() == logits.dim(0), "cross-entropy targets {} for {}",
           targets.desc(), logits.desc());
  const int64_t V = logits.dim(1);
  const int64_t* y = targets.data_as<int64_t>();
  for (int64_t t = 0; t < targets.numel(); ++t)
    MT_CHECK(y[t] == kIgnore || (y[t] >= 0 && y[t] < V), "target {} at row {} outside [0, {})", y[t], t, V);
}
}  // namespace

Tensor causal_lm_targets(const Tensor& labels, int64_t vocab) {
  MT_CHECK(labels.dtype() == DType::I64 && labels.ndim() == 2, "labels must be I64 [B, S], got {}", labels.desc());
  const int64_t B = labels.dim(0), S = labels.dim(1);
  const int64_t* l = labels.data_as<int64_t>();
  for (int64_t i = 0; i < B * S; ++i)
    if (l[i] != kIgnore && (l[i] < 0 || l[i] >= vocab))
      fail("labels[{}, {}] = {} is neither -100 nor in [0, {})", i / S, i % S, l[i], vocab);
  Tensor t = Tensor::empty({B * S}, DType::I64);
  int64_t* y = t.data_as<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) y[b * S + s] = s + 1 < S ? l[b * S + s + 1] : kIgnore;
  return t;
}

CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& targets) {
  check_targets(logits, targets);
  const int64_t N = logits.dim(0), V = logits.dim(1);
  const float* z = logits.data_as<float>();
  const int64_t* y = targets.data_as<int64_t>();
  std::vector<double> per_row(static_cast<size_t>(N), 0.0);
#pragma omp parallel for schedule(static) if ((N * V) >= kParallelMinWork)
  for (int64_t t = 0; t < N; ++t) {
    if (y[t] == kIgnore) continue;
    per_row[t] = static_cast<double>(row_lse(z + t * V, V)) - static_cast<double>(z[t * V + y[t]]);
  }
  CrossEntropyResult r;
  for (int64_t t = 0; t < N; ++t) {
    if (y[t] == kIgnore) continue;
    r.loss_sum += per_row[t];
    r.count++;
  }
  return r;
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, float scale, Tensor& dlogits) {
  check_targets(logits, targets);
  const int64_t N = logits.dim(0), V = logits.dim(1);
  check_f32(dlogits, "cross-entropy dlogits", {N, V});
  const float* z = logits.data_as<float>();
  const int64_t* y = targets.data_as<int64_t>();
  float* d = dlogits.data_as<float>();
#pragma omp parallel for schedule(static) if ((N * V) >= kParallelMinWork)
  for (int64_t t = 0; t < N; ++t) {
    float* dr = d + t * V;
    if (y[t] == kIgnore) {
      for (int64_t i = 0; i < V; ++i) dr[i] = 0.0f;
      continue;
    }
    const float lse = row_lse(z + t * V, V);
    for (int64_t i = 0; i < V; ++i) dr[i] = scale * std::exp(z[t * V + i] - lse);
    dr[y[t]] -= scale;
  }
}

}  // namespace mt::cpu
