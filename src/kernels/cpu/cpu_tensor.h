// Small helpers shared by the CPU reference ops: dtype/shape checks on the Tensor boundary,
// fp32 views of parameters, bf16 rounding of fp32 buffers, and thin cblas_sgemm wrappers.
// Activations in the CPU backend are always F32 buffers; in bf16 mode they hold bf16-representable
// values (each op rounds its output where Transformers rounds, hf-numerics.md §1.1).
#pragma once
#include <cstdint>

#include "core/float_convert.h"
#include "core/tensor.h"

namespace mt::cpu {

// Element count below which a row loop stays serial: waking the OpenMP team costs more than tiny
// work, badly so on a loaded machine. Results do not depend on it (every row is computed alike).
constexpr int64_t kParallelMinWork = int64_t{1} << 15;

// Internal contract checks (a caller bug if they fire): F32 on the CPU with the given shape.
void check_f32(const Tensor& t, const char* what, const Shape& shape);
void check_f32_numel(const Tensor& t, const char* what, int64_t numel);
// A parameter as fp32: the tensor itself when F32, else a converted copy (BF16 is exact in fp32).
Tensor param_f32(const Tensor& w);
// Parameter element count check for F32|BF16 parameters.
void check_param(const Tensor& w, const char* what, const Shape& shape);

inline void round_bf16_inplace(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
}

// Row-major GEMM wrappers. C[M,N] = alpha * op(A) * op(B) + beta * C, with leading dimensions.
// nt: A[M,K]·B[N,K]ᵀ   nn: A[M,K]·B[K,N]   tn: A[K,M]ᵀ·B[K,N]
void gemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, float* C, int64_t ldc);
void gemm_nn(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, float* C, int64_t ldc);
void gemm_tn(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, float* C, int64_t ldc);

}  // namespace mt::cpu
