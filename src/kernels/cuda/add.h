// Elementwise sum of two device tensors of one dtype (BF16 or F32): out = a + b in fp32, rounded once to
// the dtype. Used where a collective's sum is finished locally (the two-rank reduce-scatter of
// layers/cuda/expert_parallel_cuda.cpp). out may alias a or b. Asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

void add(const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t stream);

}  // namespace mt::cuda
