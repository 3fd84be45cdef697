// Grouped expert GEMM on the GPU: one launch multiplies every expert's rows of the expert-contiguous
// layout (kernels/cuda/moe_permute.h) by that expert's weight, reading the row ranges from the DEVICE
// offsets (no host sync; experts with zero rows are skipped). bf16 inputs, fp32 accumulation.
//
// Shapes (N = rows of the grouped layout, at least offsets[E]; rows past offsets[E] are not touched):
//   forward  y  BF16 [N, Nout] = x BF16 [N, K] · w_eᵀ        w BF16 [E, Nout, K]  (nn.Linear layout)
//   dgrad    dx BF16 [N, K]    = dy BF16 [N, Nout] · w_e
//   wgrad    dw F32|BF16 [E, Nout, K] (+)= dy_eᵀ · x_e       (K-grouped: the reduction runs over expert e's rows;
//            a BF16 dw gets the fp32 sum of this call added to it and rounded once; the Hopper kernel rounds the
//            sum to bf16 first and adds in bf16, as bf16 autograd accumulates: two roundings)
// Requires Nout % 8 == 0, K % 8 == 0 and 16-byte aligned data (16-byte copies); offsets I32 [E + 1]
// non-decreasing with offsets[0] = 0 and offsets[E] <= N (moe_plan makes them so; not re-checked on the host).
// Every call is asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

void grouped_gemm_forward(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y, cudaStream_t stream);
void grouped_gemm_dgrad(const Tensor& dy, const Tensor& w, const Tensor& offsets, Tensor& dx, cudaStream_t stream);
// accumulate: dw += (else dw =; an expert without rows then gets zeros).
void grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, Tensor& dw, bool accumulate,
                        cudaStream_t stream);
// Two micro-batches in one dW pass: dW_e (+)= dy1_eᵀ·x1_e + dy2_eᵀ·x2_e (each pair with its own grouped layout
// and offsets). Half the dW read-add-write traffic of two calls, which is what bounds the wgrad.
void grouped_gemm_wgrad2(const Tensor& dy1, const Tensor& x1, const Tensor& offsets1, const Tensor& dy2,
                         const Tensor& x2, const Tensor& offsets2, Tensor& dw, bool accumulate, cudaStream_t stream);

}  // namespace mt::cuda
