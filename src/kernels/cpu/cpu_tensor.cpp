#include "kernels/cpu/cpu_tensor.h"

#include <cblas.h>

#include "core/error.h"

namespace mt::cpu {

void check_f32(const Tensor& t, const char* what, const Shape& shape) {
  MT_CHECK(t.defined(), "{} is undefined", what);
  MT_CHECK(t.dtype() == DType::F32 && t.device().is_cpu(), "{} must be a CPU F32 tensor, got {}", what, t.desc());
  MT_CHECK(t.shape() == shape, "{} must be {}, got {}", what, shape_str(shape), t.desc());
}

void check_f32_numel(const Tensor& t, const char* what, int64_t numel) {
  MT_CHECK(t.defined(), "{} is undefined", what);
  MT_CHECK(t.dtype() == DType::F32 && t.device().is_cpu(), "{} must be a CPU F32 tensor, got {}", what, t.desc());
  MT_CHECK(t.numel() == numel, "{} must have {} elements, got {}", what, numel, t.desc());
}

void check_param(const Tensor& w, const char* what, const Shape& shape) {
  MT_CHECK(w.defined(), "{} is undefined", what);
  MT_CHECK((w.dtype() == DType::F32 || w.dtype() == DType::BF16) && w.device().is_cpu(),
           "{} must be a CPU F32 or BF16 tensor, got {}", what, w.desc());
  MT_CHECK(w.shape() == shape, "{} must be {}, got {}", what, shape_str(shape), w.desc());
}

Tensor param_f32(const Tensor& w) {
  if (w.dtype() == DType::F32) return w;
  MT_CHECK(w.dtype() == DType::BF16, "parameter {} must be F32 or BF16", w.desc());
  Tensor r = Tensor::empty(w.shape(), DType::F32);
  const uint16_t* s = w.data_as<uint16_t>();
  float* d = r.data_as<float>();
  const int64_t n = w.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
  return r;
}

namespace {
bool empty_gemm(int64_t M, int64_t N) { return M == 0 || N == 0; }
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  // K == 0: BLAS leaves C = beta*C; do it here since some BLAS builds reject K = 0 leading dims.
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}
}  // namespace

void gemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, float* C, int64_t ldc) {
  if (empty_gemm(M, N)) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta,
              C, (int)ldc);
}

void gemm_nn(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, float* C, int64_t ldc) {
  if (empty_gemm(M, N)) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb,
              beta, C, (int)ldc);
}

void gemm_tn(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, float* C, int64_t ldc) {
  if (empty_gemm(M, N)) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta,
              C, (int)ldc);
}

}  // namespace mt::cpu
