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
// Every rank of the group must run the same number of MoE layers and micro-batches (each call is a
// collective). The results equal cpu::experts_forward / experts_backward on the whole batch up to the order
// of fp32 sums in the expert GEMMs (rows of several ranks go through one GEMM). Expert weight gradients
// of experts this rank does not own stay zero here: summing the gradients over all ranks (data parallel)
// gives every expert its full gradient.
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
};

struct EpExpertsSaved {
  std::vector<std::vector<int64_t>> slots;  // [ep][...]: this rank's flat slots (t·k + s) sent to group[j]
  std::vector<int64_t> recv_rows;           // [ep]: rows received from group[j] (forward)
  Tensor y_slots;                           // F32 [T·k, H]: each slot's expert output (before its weight)
  cpu::ExpertsSaved local;                  // the owned experts' forward on the received rows
};

// Same contract as cpu::experts_forward (gate_up / down: all E experts' tensors; only the owned slice is
// read). `saved` is required when a backward follows.
Tensor ep_experts_forward(const ExpertParallel& ep, const Tensor& x, const Tensor& index, const Tensor& weights,
                          const Tensor& gate_up, const Tensor& down, bool bf16, EpExpertsSaved* saved);

// Same contract as cpu::experts_backward; dgate_up / ddown get the owned experts' gradients added.
void ep_experts_backward(const ExpertParallel& ep, const Tensor& dout, const Tensor& weights, const Tensor& gate_up,
                         const Tensor& down, const EpExpertsSaved& saved, Tensor& dx, Tensor& dweights,
                         Tensor& dgate_up, Tensor& ddown);

}  // namespace mt
