// Global gradient norm and clipping with torch.nn.utils.clip_grad_norm_ semantics:
//   total = ‖(‖g_1‖, ‖g_2‖, …)‖₂;  coef = min(1, max_norm / (total + 1e-6));  every g *= coef.
// Sums run in double (torch sums fp32 blocks; the difference is far below fp32 resolution of the norm).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace mt {

// L2 norm over every element of every F32 CPU tensor; NaN/Inf when any element is.
double grad_global_norm(const std::vector<Tensor*>& grads);

// The two halves of grad_global_norm, for ranks that each hold some of the summed gradients: one tensor's
// norm (rounded to fp32 as torch does), and the norm of such norms in tensor order. grad_global_norm(g) ==
// norm_of_norms({tensor_grad_norm(g_1), tensor_grad_norm(g_2), …}) bitwise.
double tensor_grad_norm(const Tensor& grad);
double norm_of_norms(const std::vector<double>& norms);
// tensor_grad_norm's own halves, for a tensor whose rows several ranks hold (the experts under expert
// parallelism): each rank's Σ g² of its rows, summed over the ranks, then the norm (rounded to fp32).
double tensor_grad_sumsq(const Tensor& grad);
double norm_of_sumsq(double sumsq);

// Scales the gradients so their global norm is at most max_norm (given the norm already measured);
// returns the coefficient applied (1 when nothing was scaled). max_norm <= 0 disables clipping.
double grad_clip_to(const std::vector<Tensor*>& grads, double total_norm, double max_norm);

}  // namespace mt
