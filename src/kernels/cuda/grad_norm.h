// Global gradient norm and the clipping coefficient, on the device, with torch's
// clip_grad_norm_ semantics (as train/grad_clip.h on the CPU):
//   total = ‖(‖g_1‖, ‖g_2‖, …)‖₂ (each tensor's norm rounded to fp32), coef = min(1, max_norm / (total + 1e-6)).
// Deterministic: fixed chunks summed in a fixed order (no atomics). Nothing is synchronised; the AdamW
// kernel reads `coef` from device memory and multiplies the gradients as it reads them.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace mt::cuda {

// grads: F32|BF16 CUDA tensors on one device. norm, coef: F32 [1] (overwritten). max_norm <= 0: coef = 1.
// A NaN/Inf gradient gives a NaN/Inf norm (and a NaN coef), as torch without error_if_nonfinite.
// reduce_sumsq (optional) is called between the per-tensor sums and the total with the F64 [grads.size()]
// tensor of each gradient's Σ g², to complete them across ranks (sharded gradients), on `stream`.
void grad_norm_clip_coef(const std::vector<const Tensor*>& grads, float max_norm, Tensor& norm, Tensor& coef,
                         cudaStream_t stream, const std::function<void(Tensor&)>& reduce_sumsq = {});

}  // namespace mt::cuda
