// Row subsets of a [T, C] tensor by an index list: the LM head runs on the rows that have a target only
// (models/cuda/decoder_cuda_model.cpp), as the CPU head does (layers/lm_head.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

// out [R, C] = src[rows[i]] for i < R; rows I32 [R] on the device, each in [0, T) (the caller's invariant:
// built on the host from the batch). Any dtype; a copy, so exact.
void rows_gather(const Tensor& src, const Tensor& rows, Tensor& out, cudaStream_t stream);

// out [T, C] = 0 except out[rows[i]] = src[i] (src [R, C], rows distinct): the inverse of rows_gather.
void rows_scatter(const Tensor& src, const Tensor& rows, Tensor& out, cudaStream_t stream);

}  // namespace mt::cuda
