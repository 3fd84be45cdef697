#include "kernels/cpu/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

// NOTE: like attention_forward, the head loop is serial and each matmul is one cblas_sgemm (OpenBLAS
// threads it); only the row softmax is OpenMP-parallel.

namespace mt::cpu {

namespace {

// Row r of P (stride L) holds the scores of query r (at position offset + r) on entry; keys first..offset+r are
// visible (first = 0, or the window's start). Writes the probabilities as attention_forward does: fp32
// (lse = m + log Σ exp(x − m) over the visible keys and the sink, p = exp(x − lse)), or eager bf16 (c = bf16(x − m),
// p = bf16(exp(c) / Σ exp(c))); masked entries 0.
void softmax_visible_rows(int64_t n, int64_t L, int64_t offset, int64_t window, const float* sink, bool eager_bf16,
                          float* P) {
#pragma omp parallel for schedule(static) if ((n * L) >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    float* row = P + r * L;
    const int64_t last = offset + r;  // last visible key
    const int64_t first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
    float m = sink ? *sink : -std::numeric_limits<float>::infinity();
    for (int64_t j = first; j <= last; ++j) m = std::max(m, row[j]);
    auto shifted = [&](float x) { return eager_bf16 ? round_bf16(x - m) : x - m; };
    double sum = sink ? std::exp(static_cast<double>(shifted(*sink))) : 0.0;
    for (int64_t j = first; j <= last; ++j) sum += std::exp(static_cast<double>(shifted(row[j])));
    if (eager_bf16) {
      const float fs = static_cast<float>(sum);
      for (int64_t j = 0; j < L; ++j)
        row[j] = (j >= first && j <= last) ? round_bf16(std::exp(shifted(row[j])) / fs) : 0.0f;
      continue;
    }
    const float lse = m + static_cast<float>(std::log(sum));
    for (int64_t j = 0; j < L; ++j) row[j] = (j >= first && j <= last) ? std::exp(row[j] - lse) : 0.0f;
  }
}

}  // namespace

Tensor attention_decode_forward(const AttentionDecodeShape& s, const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, bool bf16, const Tensor& sinks) {
  MT_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0, "attention heads {} / kv_heads {}", s.heads,
           s.kv_heads);
  MT_CHECK(s.offset >= 0 && s.queries >= 1, "attention decode offset {} queries {}", s.offset, s.queries);
  const int64_t n = s.queries, Hq = s.heads, Hk = s.kv_heads, D = s.head_dim, group = Hq / Hk;
  const int64_t Dv = s.v_dim > 0 ? s.v_dim : D;
  const int64_t L = s.offset + n;  // keys visible to the last query
  check_f32(q, "attention decode q", {n, Hq, D});
  MT_CHECK(k_cache.ndim() == 3 && k_cache.dim(0) >= L, "attention decode k cache {} for {} keys", k_cache.desc(), L);
  check_f32(k_cache, "attention decode k cache", {k_cache.dim(0), Hk, D});
  check_f32(v_cache, "attention decode v cache", {k_cache.dim(0), Hk, Dv});
  const float scale = s.scale > 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const bool eager = bf16 && s.eager_bf16;
  std::vector<float> sink;
  if (sinks.defined()) {
    MT_CHECK(sinks.ndim() == 1 && sinks.dim(0) == Hq, "attention decode sinks {} for {} heads", sinks.desc(), Hq);
    sink = param_f32(sinks).to_floats();
  }
  Tensor out = Tensor::empty({n, Hq, Dv}, DType::F32);
  std::vector<float> P(static_cast<size_t>(n * L));
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t g = h / group;
    const float* qp = q.data_as<float>() + h * D;
    const float* kp = k_cache.data_as<float>() + g * D;
    const float* vp = v_cache.data_as<float>() + g * Dv;
    float* op = out.data_as<float>() + h * Dv;
    if (eager) {  // bf16(bf16(q·k)·scale), as the eager matmul and multiply round
      gemm_nt(n, L, D, 1.0f, qp, Hq * D, kp, Hk * D, 0.0f, P.data(), L);
      for (float& x : P) x = round_bf16(round_bf16(x) * scale);
    } else {
      gemm_nt(n, L, D, scale, qp, Hq * D, kp, Hk * D, 0.0f, P.data(), L);
    }
    softmax_visible_rows(n, L, s.offset, s.window, sink.empty() ? nullptr : &sink[static_cast<size_t>(h)], eager,
                         P.data());
    if (bf16 && !eager) round_bf16_inplace(P.data(), n * L);
    gemm_nn(n, Dv, L, 1.0f, P.data(), L, vp, Hk * Dv, 0.0f, op, Hq * Dv);
  }
  if (bf16) round_bf16_inplace(out.data_as<float>(), out.numel());
  return out;
}

}  // namespace mt::cpu
