#include "kernels/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

void softmax_rows_f32(const float* x, int64_t rows, int64_t n, float* out, bool round_out) {
#pragma omp parallel for schedule(static) if ((rows * n) >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    float m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, xr[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      o[i] = std::exp(xr[i] - m);
      sum += o[i];
    }
    const float fs = static_cast<float>(sum);
    for (int64_t i = 0; i < n; ++i) o[i] = round_out ? round_bf16(o[i] / fs) : o[i] / fs;
  }
}

void topk_row(const float* p, int64_t n, int64_t k, int32_t* idx) {
  // Partial selection sort: k is small. Strictly greater wins, so equal values keep the lower index.
  std::vector<char> taken(static_cast<size_t>(n), 0);
  for (int64_t s = 0; s < k; ++s) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i)
      if (!taken[i] && (best < 0 || p[i] > p[best] || (std::isnan(p[i]) && !std::isnan(p[best])))) best = i;
    taken[best] = 1;
    idx[s] = static_cast<int32_t>(best);
  }
}

namespace {
// Checks logits F32 [T, E] and top-k, and allocates the outputs.
RouterOutput router_output_for(const Tensor& logits, int64_t k) {
  MT_CHECK(logits.ndim() == 2, "router logits must be [T, E], got {}", logits.desc());
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_f32(logits, "router logits", {T, E});
  MT_CHECK(k >= 1 && k <= E, "router top-k {} with {} experts", k, E);
  return RouterOutput{Tensor::empty({T, E}, DType::F32), Tensor::empty({T, k}, DType::I32),
                      Tensor::empty({T, k}, DType::F32), Tensor::empty({T, k}, DType::F32)};
}
}  // namespace

RouterOutput router_forward(const Tensor& logits, int64_t k, bool norm_topk_prob, bool bf16) {
  RouterOutput r = router_output_for(logits, k);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  float* p = r.probs.data_as<float>();
  softmax_rows_f32(logits.data_as<float>(), T, E, p, false);
  int32_t* idx = r.index.data_as<int32_t>();
  float* val = r.value.data_as<float>();
  float* w = r.weights.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * E) >= kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    topk_row(p + t * E, E, k, idx + t * k);
    float sum = 0.0f;
    for (int64_t s = 0; s < k; ++s) {
      val[t * k + s] = p[t * E + idx[t * k + s]];
      sum += val[t * k + s];
    }
    if (norm_topk_prob)
      for (int64_t s = 0; s < k; ++s) val[t * k + s] /= sum;
    for (int64_t s = 0; s < k; ++s) w[t * k + s] = bf16 ? round_bf16(val[t * k + s]) : val[t * k + s];
  }
  return r;
}

Tensor router_backward(const Tensor& dweights, const RouterOutput& r, bool norm_topk_prob) {
  const int64_t T = r.probs.dim(0), E = r.probs.dim(1), k = r.index.dim(1);
  check_f32(dweights, "router dweights", {T, k});
  Tensor dlogits = Tensor::empty({T, E}, DType::F32);
  const float* p = r.probs.data_as<float>();
  const int32_t* idx = r.index.data_as<int32_t>();
  const float* val = r.value.data_as<float>();
  const float* dw = dweights.data_as<float>();
  float* dl = dlogits.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * E) >= kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> dp(static_cast<size_t>(E), 0.0f);
    if (norm_topk_prob) {
      // v'_s = v_s / Σv: dv_s = (dv'_s − Σ_j dv'_j·v'_j) / Σv, with Σv = v_s / v'_s.
      float sum = 0.0f;
      for (int64_t s = 0; s < k; ++s) sum += p[t * E + idx[t * k + s]];
      double dot = 0.0;
      for (int64_t s = 0; s < k; ++s) dot += static_cast<double>(dw[t * k + s]) * val[t * k + s];
      for (int64_t s = 0; s < k; ++s) dp[idx[t * k + s]] += (dw[t * k + s] - static_cast<float>(dot)) / sum;
    } else {
      for (int64_t s = 0; s < k; ++s) dp[idx[t * k + s]] += dw[t * k + s];
    }
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(p[t * E + e]) * dp[e];
    for (int64_t e = 0; e < E; ++e) dl[t * E + e] = p[t * E + e] * (dp[e] - static_cast<float>(dot));
  }
  return dlogits;
}

RouterOutput router_topk_softmax_forward(const Tensor& logits, int64_t k, bool bf16) {
  RouterOutput r = router_output_for(logits, k);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const float* l = logits.data_as<float>();
  softmax_rows_f32(l, T, E, r.probs.data_as<float>(), false);
  int32_t* idx = r.index.data_as<int32_t>();
  float* val = r.value.data_as<float>();
  float* w = r.weights.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * E) >= kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    topk_row(l + t * E, E, k, idx + t * k);
    std::vector<float> top(static_cast<size_t>(k));
    for (int64_t s = 0; s < k; ++s) top[s] = l[t * E + idx[t * k + s]];
    softmax_rows_f32(top.data(), 1, k, val + t * k, false);
    for (int64_t s = 0; s < k; ++s) w[t * k + s] = bf16 ? round_bf16(val[t * k + s]) : val[t * k + s];
  }
  return r;
}

Tensor router_topk_softmax_backward(const Tensor& dweights, const RouterOutput& r) {
  const int64_t T = r.probs.dim(0), E = r.probs.dim(1), k = r.index.dim(1);
  check_f32(dweights, "router dweights", {T, k});
  Tensor dlogits = Tensor::empty({T, E}, DType::F32);
  dlogits.fill_zero();
  const int32_t* idx = r.index.data_as<int32_t>();
  const float* val = r.value.data_as<float>();
  const float* dw = dweights.data_as<float>();
  float* dl = dlogits.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * E) >= kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    // softmax over the k selected logits: dl_s = v_s·(dw_s − Σ_j dw_j·v_j)
    double dot = 0.0;
    for (int64_t s = 0; s < k; ++s) dot += static_cast<double>(dw[t * k + s]) * val[t * k + s];
    for (int64_t s = 0; s < k; ++s)
      dl[t * E + idx[t * k + s]] = val[t * k + s] * (dw[t * k + s] - static_cast<float>(dot));
  }
  return dlogits;
}

}  // namespace mt::cpu
