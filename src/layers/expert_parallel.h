// Expert parallelism for the CPU reference engine: the experts of an MoE layer are split over an
// expert-parallel group of ranks (rank j of the group owns experts [j·E/ep, (j+1)·E/ep)); each token slot
// is sent to the rank owning its expert, computed there with that rank's experts, and its output sent back.
//
//   forward:  route locally -> all_to_allv (token rows + local expert id, one message per destination rank,
//             slots in ascending order) -> experts on the received rows (cpu::experts_forward, one slot per
//             row, weight 1) -> all_to_allv back -> the routing-weighted combine, as cpu::experts_forward does
//   backward: dweights and the per-slot dY locally -> all_to_allv -> cpu::experts_backward on the received
//             rows (weight gradients of the owned experts only) -> all_to_allv back -> dX summed over slots
//
// A rank holds only its own experts' weights and gradients ([E/ep, ...] stacks), their biases too (GPT-OSS's
// [E/ep, 2I] / [E/ep, H] rows, cpu::ExpertsVariant): each received row runs its expert's whole MLP (biases, the
// clamped SwiGLU) on the owner, so the bias gradients land there with the weights'. Every rank of the group must
// run the same number of MoE layers and micro-batches (each call is a collective). The results equal
// cpu::experts_forward / experts_backward on the whole batch up to the order of fp32 sums in the expert GEMMs
// (rows of several ranks go through one GEMM). The expert weight gradients cover the group's tokens; ranks
// of other groups holding the same experts (replicas, when the job has more ranks than ep) sum theirs with
// them (train/train_engine.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/experts.h"

namespace mt {

class Communicator;

struct ExpertParallel {
  Communicator* comm = nullptr;
  std::vector<int> group;         // the group's ranks in order; this rank is group[me]
  int me = 0;
  int64_t experts_per_rank = 0;   // E / ep
  std::vector<int> replicas;      // the ranks holding this rank's experts (one per group, this one included)
  int64_t first_expert() const { return me * experts_per_rank; }
};

// The layout of a job of comm->size() ranks with expert-parallel groups of `ep` consecutive ranks, for this
// rank; ep 1 gives none (an empty group). A size that does not divide the ranks or the experts is a one-line
// error naming parallel.ep.
ExpertParallel expert_parallel_for(Communicator* comm, int64_t ep, int64_t num_experts);

struct EpExpertsSaved {
  std::vector<std::vector<int64_t>> slots;  // [ep][...]: this rank's flat slots (t·k + s) sent to group[j]
  std::vector<int64_t> recv_rows;           // [ep]: rows received from group[j] (forward)
  Tensor y_slots;                           // F32 [T·k, H]: each slot's expert output (before its weight)
  cpu::ExpertsSaved local;                  // the owned experts' forward on the received rows
};

// Same contract as cpu::experts_forward, but gate_up / down (and the variant's biases) are this rank's experts
// only ([E/ep, 2I, H], [E/ep, H, I], [E/ep, 2I], [E/ep, H]: experts first_expert() ...); index still names experts
// of the whole model. `saved` is required when a backward follows.
Tensor ep_experts_forward(const ExpertParallel& ep, const Tensor& x, const Tensor& index, const Tensor& weights,
                          const Tensor& gate_up, const Tensor& down, bool bf16, EpExpertsSaved* saved,
                          const cpu::ExpertsVariant& variant = {});

// Same contract as cpu::experts_backward, on this rank's experts: dgate_up / ddown ([E/ep, ...]) and, with a biased
// variant, bias_grads ([E/ep, 2I], [E/ep, H]) get their gradients added.
void ep_experts_backward(const ExpertParallel& ep, const Tensor& dout, const Tensor& weights, const Tensor& gate_up,
                         const Tensor& down, const EpExpertsSaved& saved, Tensor& dx, Tensor& dweights,
                         Tensor& dgate_up, Tensor& ddown, const cpu::ExpertsVariant& variant = {},
                         const cpu::ExpertsBiasGrads& bias_grads = {});

}  // namespace mt
