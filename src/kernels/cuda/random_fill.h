// Seeded fills made on the device (synthetic models for `mixtune bench`: a 30B-parameter init on the
// host would take minutes). Counter-based (splitmix64 of seed and element index, Box-Muller), so a
// fill is the same on every run and independent of the launch shape. Not the CPU init's numbers.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

// t (BF16|F32 on a CUDA device) = normal(0, stddev) per element.
void fill_normal(Tensor& t, float stddev, uint64_t seed, cudaStream_t stream);
// t (BF16|F32 on a CUDA device) = value.
void fill_constant(Tensor& t, float value, cudaStream_t stream);

}  // namespace mt::cuda
