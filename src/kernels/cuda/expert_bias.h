// DeepSeek-V3's auxiliary-loss-free bias update on the GPU, the twin of kernels/cpu/expert_bias.h (which states the
// rule): bias_e += γ · sign(Σ load − E·load_e), the sign on int64 integers, γ rounded to fp32 once and added in fp32,
// so the result is bitwise the CPU's. One block per call (E ≤ 65,536, far above any router); asynchronous on
// `stream`; loads are trusted (non-negative counts from the router, not checked without a sync).
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

// load I32 [E], bias F32 [E], both on one CUDA device; rate finite >= 0 (checked on the host).
void expert_bias_update(const Tensor& load, Tensor& bias, double rate, cudaStream_t stream);

}  // namespace mt::cuda
