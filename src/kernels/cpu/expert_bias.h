// DeepSeek-V3's auxiliary-loss-free load balancing (DeepSeek-V3 technical report §2.1.2; the CUDA twin is
// kernels/cuda/expert_bias.h): after each optimizer step, every MoE layer's selection bias (the fp32 buffer
// e_score_correction_bias, which steers the top-k choice but not the routing weights) moves toward balance:
//   bias_e += γ · sign(mean_load − load_e),   mean_load = Σ_e load_e / E,   sign(0) = 0
// load_e = the slots routed to expert e in that step (every micro-batch, every rank). The sign is taken exactly, on
// integers: sign(Σ load − E·load_e) (int64). γ is rounded to fp32 once and added in fp32 (exact ±γ or nothing, so the
// CPU and the GPU give the same bits).
// Also the balance metric logged for every MoE family: max_e load_e / mean_load (1 = perfectly even).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::cpu {

// load I32 [E] (counts >= 0), bias F32 [E], both on the CPU; rate γ finite >= 0. bias updated in place.
void expert_bias_update(const Tensor& load, Tensor& bias, double rate);

// max_e load_e / (Σ load / E) of load I32 [E] on the CPU; 0 when no slot was routed.
double expert_load_max_over_mean(const Tensor& load);

}  // namespace mt::cpu
