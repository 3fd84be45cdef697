// Token permutation for the experts on the GPU: the expert-contiguous layout that the grouped GEMM
// consumes (kernels/cuda/grouped_gemm.h), built on the device from the router's top-k ids with no
// host sync, and the gather / combine (unpermute) around the expert GEMMs, with their backward.
//
// Layout contract: slot t·k + s (token t, choice s) goes to grouped row row_of_slot[t·k + s]; the rows
// of expert e are [offsets[e], offsets[e+1]), in ascending slot order (a stable counting sort, so the
// layout is deterministic and equal to the CPU's ExpertsSaved). Experts with no tokens have empty ranges.
//
// Routing weights are applied in the combine, as HF's grouped_mm path does (hf-numerics.md §1.3):
// out[t] = Σ_s bf16(w[t,s] · y[row]) summed in fp32 and rounded once. With fp32 routing weights (DeepSeek-V3) the
// products stay fp32 (moe_combine's round_product). Passing no weights gives the plain
// sum, for a caller that applied the weights earlier (e.g. in the expert activation, cuda/swiglu.h).
// Every call is asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

struct MoePlan {
  Tensor offsets;      // I32 [E + 1]
  Tensor row_of_slot;  // I32 [T·k]: slot -> grouped row
  Tensor slot_of_row;  // I32 [T·k]: grouped row -> slot
  int64_t tokens = 0, top_k = 0, experts = 0;
  // A local plan (moe_plan_local) has one more bucket than live experts: the slots routed to other ranks'
  // experts, sorted last (rows from offsets[live_experts] on). The combine and its backward skip them.
  int64_t live_experts = 0;
  bool local() const { return live_experts < experts; }
  Tensor live_offsets() const { return offsets.rows(0, live_experts + 1); }  // the grouped GEMMs' offsets
};

// index I32 [T, k] on a CUDA device with values in [0, experts) (as router_forward makes them; an id
// outside is clamped into range, never written out of bounds).
MoePlan moe_plan(const Tensor& index, int64_t experts, cudaStream_t stream);

// The plan of one rank's experts [first, first + count) of `experts` (expert parallelism by all-gather: the
// rank sees every token of its group and runs only its own experts): the live buckets are those experts,
// the last bucket every other slot. Rows of live expert j: [offsets[j], offsets[j+1]); the live row count
// offsets[count] stays on the device (kernels/cuda/ep_row_watch.h bounds it by the buffers' rows).
MoePlan moe_plan_local(const Tensor& index, int64_t experts, int64_t first, int64_t count, cudaStream_t stream);

// x BF16 [T, H] -> BF16 [T·k, H], grouped row r = x[slot_of_row[r] / k].
Tensor moe_gather(const Tensor& x, const MoePlan& plan, cudaStream_t stream);
// A local plan's live rows into xg BF16 [R, H]: grouped rows r < min(R, offsets[live_experts]), the count read
// on the device (no host sync); rows past it are untouched.
void moe_gather_live(const Tensor& x, const MoePlan& plan, Tensor& xg, cudaStream_t stream);

// y BF16 [T·k, H] (grouped rows; a local plan: [>= live rows, H]), weights F32 [T, k] or undefined -> out
// BF16|F32 [T, H] (overwritten; a local plan sums only its live slots, a token with none gets zeros).
// round_product false: each y·w stays fp32 before the fp32 sum (DeepSeek-V3's fp32 routing weights: grouped_mm's
// bf16·fp32 product is fp32, hf-numerics.md §5.3), so only the sum is rounded.
void moe_combine(const Tensor& y, const Tensor& weights, const MoePlan& plan, Tensor& out, cudaStream_t stream,
                 bool round_product = true);

// dout BF16|F32 [T, H] -> dy BF16 [T·k, H]: dy[row] = bf16(dout[t] · w[t,s]) (or dout[t] without weights),
// and, with weights, dweights F32 [T, k] = Σ_h dout[t, h] · y[row, h]. Outputs allocated by the caller.
// A local plan writes only its live rows of dy ([>= live rows, H]) and zero dweights for the other slots.
void moe_combine_backward(const Tensor& dout, const Tensor& y, const Tensor& weights, const MoePlan& plan, Tensor& dy,
                          Tensor& dweights, cudaStream_t stream);

// dxg BF16 [T·k, H] -> dx BF16|F32 [T, H] = Σ_s dxg[row(t, s)] (fp32 sum, one rounding), overwritten.
void moe_gather_backward(const Tensor& dxg, const MoePlan& plan, Tensor& dx, cudaStream_t stream);

}  // namespace mt::cuda
