// Elementwise dtype conversion on the device, BF16 <-> F32 (round-to-nearest-even to BF16; BF16 -> F32 exact):
// small parameters a kernel wants in fp32 (GPT-OSS's sink logits for flash attention) without a host trip.
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

// src and dst on one CUDA device with the same element count; dtypes BF16 or F32 each (equal: a copy).
void cast_async(const Tensor& src, Tensor& dst, cudaStream_t stream);

}  // namespace mt::cuda
