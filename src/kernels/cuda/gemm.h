// Dense GEMMs through cuBLASLt: bf16 (or fp32) inputs, fp32 accumulation, bf16 or fp32 output.
// Row-major throughout, like the CPU reference: C[M,N] = alpha·op(A)·op(B) + beta·C, where op(A) is
// [M,K] (A stored [K,M] when trans) and op(B) is [K,N] (B stored [N,K] when trans).
// Matmul descriptors, layouts and the heuristic's algorithm are cached per shape, dtypes, leading
// dimensions and pointer alignment, so a training step after the first only calls cublasLtMatmul.
// All calls are asynchronous on `stream` and use the device context's cuBLASLt workspace (do not run
// GEMMs of one device concurrently on two streams).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace mt::cuda {

struct GemmOperand {
  const void* ptr = nullptr;
  DType dtype = DType::BF16;  // BF16 or F32 (both operands the same)
  int64_t ld = 0;             // row-major leading dimension (elements between rows as stored)
  bool trans = false;
};

// Supported (A/B, C): (BF16, BF16), (BF16, F32), (F32, F32). Accumulation and alpha/beta are fp32.
// K == 0 gives C = beta·C (beta must be 0 or 1 then). M == 0 or N == 0 does nothing.
void gemm(int device, cudaStream_t stream, int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& a,
          const GemmOperand& b, float beta, void* c, DType c_dtype, int64_t ldc);

// The three GEMMs of a bias-free linear layer y = x·Wᵀ, W [out, in]. x, dy may have any leading dims.
// y [.., out] = x [.., in] · Wᵀ                      (y BF16 or F32)
void linear_forward(const Tensor& x, const Tensor& w, Tensor& y, cudaStream_t stream);
// y [.., out] = x [.., in] · Wᵀ + b, b BF16|F32 [out], rounded once to y's dtype (as torch's addmm): cuBLASLt's bias
// epilogue when b has y's dtype (the plan cache key includes it), else (or where cuBLASLt offers no algorithm, or
// K = 0) an fp32 GEMM and a fused add-and-round kernel (bias.h bias_add_rows). The bias gradient: bias.h.
void linear_forward_bias(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, cudaStream_t stream);
// dx [.., in] = dy [.., out] · W  (+ beta·dx; beta 1 accumulates a second path's gradient)
void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx, cudaStream_t stream, float beta = 0.0f);
// dW [out, in] = dyᵀ · x + beta·dW  (beta 1: accumulate into the fp32 gradient across micro-batches)
void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, cudaStream_t stream, float beta = 1.0f);

// Number of cached GEMM plans (for tests and the memory report).
int64_t gemm_plan_count();
// The cuBLASLt algorithm of the cached plan of an M x N x K GEMM (the first such plan), for the benches:
// "rank R of F: algo A tile T stages S split-k K swizzle W" (the ids are cublasLt.h's enums).
std::string gemm_plan_description(int64_t M, int64_t N, int64_t K);

namespace detail {
// Tests: false makes linear_forward_bias always take its fallback (fp32 GEMM + bias_add_rows); default true.
void linear_bias_epilogue_set(bool on);
}  // namespace detail

}  // namespace mt::cuda
