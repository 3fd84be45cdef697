// Global gradient norm and clipping with torch.nn.utils.clip_grad_norm_ semantics:
//   total = ‖(‖g_1‖, ‖g_2‖, …)‖₂;  coef = min(1, max_norm / (total + 1e-6));  every g *= coef.
// Sums run in double (torch sums fp32 blocks; the difference is far below fp32 resolution of the norm).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace mt {

// L2 norm over every element of every F32 CPU tensor; NaN/Inf when any element is.
double grad_global_norm(const std::vector<Tensor*>& grads);

// Scales the gradients so their global norm is at most max_norm (given the norm already measured);
// returns the coefficient applied (1 when nothing was scaled). max_norm <= 0 disables clipping.
double grad_clip_to(const std::vector<Tensor*>& grads, double total_norm, double max_norm);

}  // namespace mt
