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

// Row r of P (stride L) holds scale·q_r·Kᵀ on entry; keys 0..offset+r are visible. Writes the
// probabilities exactly as attention_forward's softmax_rows does (lse = m + log Σ exp(x − m), p = exp(x − lse)),
// masked entries 0.
void softmax_visible_rows(int64_t n, int64_t L, int64_t offset, float* P) {
#pragma omp parallel for schedule(static) if ((n * L) >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    float* row = P + r * L;
    const int64_t last = offset + r;  // last visible key
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j <= last; ++j) m = std::max(m, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j <= last; ++j) sum += std::exp(static_cast<double>(row[j] - m));
    const float lse = m + static_cast<float>(std::log(sum));
    for (int64_t j = 0; j < L; ++j) row[j] = j <= last ? std::exp(row[j] - lse) : 0.0f;
  }
}

}  // namespace

Tensor attention_decode_forward(const AttentionDecodeShape& s, const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, bool bf16) {
  MT_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0, "attention heads {} / kv_heads {}", s.heads,
           s.kv_heads);
  MT_CHECK(s.offset >= 0 && s.queries >= 1, "attention decode offset {} queries {}", s.offset, s.queries);
  const int64_t n = s.queries, Hq = s.heads, Hk = s.kv_heads, D = s.head_dim, group = Hq / Hk;
  const int64_t L = s.offset + n;  // keys visible to the last query
  check_f32(q, "attention decode q", {n, Hq, D});
  MT_CHECK(k_cache.ndim() == 3 && k_cache.dim(0) >= L, "attention decode k cache {} for {} keys", k_cache.desc(), L);
  check_f32(k_cache, "attention decode k cache", {k_cache.dim(0), Hk, D});
  check_f32(v_cache, "attention decode v cache", k_cache.shape());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Tensor out = Tensor::empty(q.shape(), DType::F32);
  std::vector<float> P(static_cast<size_t>(n * L));
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t g = h / group;
    const float* qp = q.data_as<float>() + h * D;
    const float* kp = k_cache.data_as<float>() + g * D;
    const float* vp = v_cache.data_as<float>() + g * D;
    float* op = out.data_as<float>() + h * D;
    gemm_nt(n, L, D, scale, qp, Hq * D, kp, Hk * D, 0.0f, P.data(), L);
    softmax_visible_rows(n, L, s.offset, P.data());
    if (bf16) round_bf16_inplace(P.data(), n * L);
    gemm_nn(n, D, L, 1.0f, P.data(), L, vp, Hk * D, 0.0f, op, Hq * D);
  }
  if (bf16) round_bf16_inplace(out.data_as<float>(), out.numel());
  return out;
}

}  // namespace mt::cpu
