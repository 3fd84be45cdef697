// Raw launcher of the elementwise add (add.cu), called by add.cpp after its checks.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mt::cuda::detail {

// n elements of bf16 (else f32); out may alias a or b.
void add_launch(const void* a, const void* b, void* out, int64_t n, bool bf16, cudaStream_t stream);

}  // namespace mt::cuda::detail
