// Expert parallelism on the GPU (the CPU twin is layers/expert_parallel.h): the experts of every MoE layer
// are split over an expert-parallel group of ranks (group rank j owns experts [j·El, (j+1)·El), El = E/ep).
// Two ways to bring the tokens to the experts over NCCL (EpDispatchMode):
//
// all_gather (the default while ep <= top-k): every rank of the group receives each token once — the
//   normalised input and the routing (ids, weights) are all-gathered, [T, ·] -> [ep·T, ·] — and runs its own
//   experts on every token routed to them (a local plan, kernels/cuda/moe_permute.h). Its weighted partial
//   sums go back with one reduce-scatter, [ep·T, H] -> [T, H]. Each token travels once per rank, not once
//   per routed expert (with top-8 over 2 ranks, 4 slots per rank on average), and the message sizes are
//   fixed: NCCL needs no row counts. The rows of this rank's experts stay a device count: inside a training
//   step their buffers get a budgeted size (distributed/ep_row_budget.h), checked on the device
//   (kernels/cuda/ep_row_watch.h) and read once at the step's sync, so the layer loop never waits for the GPU.
//   A step whose load passed the budget runs again with the count read on the host per layer and micro-batch,
//   as the first step, evaluation, and parallel.ep_row_headroom 0 do. The backward all-gathers the
//   output gradient and reduce-scatters the input gradient (on a side stream, under the expert wgrad) and
//   the routing-weight gradients.
//
// all_to_all: each token slot's row travels to the rank owning its expert and back:
//   dispatch plan   all_gather of every rank's moe_plan offsets (device), then one host wait per layer and
//                   micro-batch to read the row counts NCCL needs (the backward and a recompute reuse them)
//   to experts      the rows in this rank's plan order are already grouped by destination rank (the plan
//                   sorts by expert): one contiguous NCCL send per destination, received source-major,
//                   then regrouped expert-major for the grouped GEMMs (kernels/cuda/ep_regroup.h)
//   from experts    the inverse: expert-major -> source-major, one send back per source, landing in this
//                   rank's plan order where the combine reads them
// The backward moves the output gradients to the experts and the input gradients back the same way.
// Communication runs on the compute stream. A slot routed to two experts of the same rank is sent twice:
// it pays when ep > top-k (each token then reaches fewer ranks than the group has).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/ep_dispatch_mode.h"
#include "distributed/ep_row_budget.h"
#include "kernels/cuda/ep_regroup.h"

namespace mt {

class DeviceCommunicator;


// The expert-parallel groups of a job of `world` ranks with groups of `ep`: consecutive ranks
// {0..ep-1}, {ep..2ep-1}, ... (as the CPU engine forms them); and the groups of ranks that hold the same
// experts (the same position in their group): {0, ep, 2ep, ...}, {1, ep+1, ...}, ...
std::vector<std::vector<int>> expert_parallel_groups(int world, int64_t ep);
std::vector<std::vector<int>> expert_replica_groups(int world, int64_t ep);

class CudaExpertParallel {
 public:
  // comm: the expert-parallel group (its rank order is the expert order); experts: the model's E.
  CudaExpertParallel(DeviceCommunicator& comm, int64_t experts, EpDispatchMode mode);
  ~CudaExpertParallel();
  CudaExpertParallel(const CudaExpertParallel&) = delete;
  CudaExpertParallel& operator=(const CudaExpertParallel&) = delete;

  DeviceCommunicator& comm() const { return comm_; }
  int me() const;
  int ranks() const;
  int64_t experts_per_rank() const { return per_rank_; }
  int64_t first_expert() const { return me() * per_rank_; }

  int64_t experts() const { return experts_; }
  EpDispatchMode mode() const { return mode_; }
  // The side stream of overlapped collectives (ep_reduce_scatter_async), and its fork/join events.
  cudaStream_t side_stream() const { return side_; }
  cudaEvent_t fork_event() const { return fork_; }
  cudaEvent_t join_event() const { return join_; }

  // Bytes this rank's dispatch/return calls sent to other ranks so far (its own rows are a local copy),
  // for the bench's bandwidth figure.
  int64_t bytes_sent() const { return bytes_sent_; }
  void count_sent(int64_t bytes) const { bytes_sent_ += bytes; }
  // Host seconds spent waiting for the row counts so far (the GPU finishing everything queued before them).
  double host_wait_s() const { return host_wait_s_; }
  void count_wait(double s) const { host_wait_s_ += s; }
  void count_read() const { ++host_reads_; }
  // Page-locked room for every group rank's plan offsets ([ranks, E + 1] I32): the host wait reads it.
  int32_t* pinned_offsets() const { return pinned_; }
  // Host reads of row counts so far (ep_live_rows, ep_dispatch_plan): one per layer and micro-batch outside
  // a budgeted step.
  int64_t host_reads() const { return host_reads_; }

  // The all_gather dispatch's row budget (distributed/ep_row_budget.h). A training step brackets its
  // micro-batches with begin_step / end_step; outside them (evaluation) the rows are counted on the host.
  void set_row_headroom(double headroom) { budget_ = EpRowBudget(headroom); }
  const EpRowBudget& row_budget() const { return budget_; }
  // Zeroes the device watch; the step's layers use the budget unless `exact` or there is none yet.
  void begin_step(cudaStream_t stream, bool exact);
  // After the step's sync: its largest load (fixed point) and the layers whose load passed the budget; the
  // budget rises to the load times the headroom.
  struct StepRows {
    int64_t load = 0, overflows = 0;
  };
  StepRows end_step(cudaStream_t stream);
  // Inside a budgeted step: the rows of a micro-batch's expert buffers (share: the even share T·k; most: the
  // largest possible load); else 0: count them on the host (ep_live_rows).
  int64_t budget_rows(int64_t share, int64_t most) const { return budgeted_ ? budget_.rows(share, most) : 0; }
  // I32 [2]: the step's load and overflow count (kernels/cuda/ep_row_watch.h).
  Tensor& watch() const { return watch_; }

 private:
  DeviceCommunicator& comm_;
  int64_t experts_ = 0, per_rank_ = 0;
  EpDispatchMode mode_ = EpDispatchMode::all_gather;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  int32_t* pinned_ = nullptr;  // page-locked copy of the gathered offsets (the host wait reads it)
  mutable int64_t bytes_sent_ = 0;
  mutable double host_wait_s_ = 0;
  mutable int64_t host_reads_ = 0;
  EpRowBudget budget_;
  bool budgeted_ = false;
  mutable Tensor watch_;
};

// One layer's dispatch of one micro-batch.
struct EpDispatch {
  cuda::EpLayout layout;  // device: source-major <-> expert-major segments, expert-major offsets
  std::vector<int64_t> send_first, send_rows;  // per group rank, in this rank's plan-order rows
  std::vector<int64_t> recv_first, recv_rows;  // per group rank, in the source-major buffer
  int64_t recv_total = 0;                      // rows of this rank's experts (N)
  bool active() const { return layout.ranks > 0; }
};

// Collective over the group. plan_offsets: this rank's moe_plan offsets, I32 [E + 1] on the device.
EpDispatch ep_dispatch_plan(const CudaExpertParallel& ep, const Tensor& plan_offsets, cudaStream_t stream,
                            const std::string& what);
// The rows of the buffers holding N received rows: N rounded up to 1/16 of its power of two (at most 6%
// more, at least 1). The received count changes with every layer and micro-batch; a few repeating sizes
// let the caching allocator reuse its blocks instead of calling cudaMalloc (and returning its cache, a
// device sync) thousands of times a step. The rows past N are never read as data.
int64_t ep_padded_rows(int64_t n);

// Collective. rows BF16 [T·k, H] in this rank's plan order -> BF16 [ep_padded_rows(N), H]: the rows of this
// rank's experts, expert-major (layout.local_offsets).
Tensor ep_to_experts(const CudaExpertParallel& ep, const EpDispatch& d, const Tensor& rows, cudaStream_t stream,
                     const std::string& what);
// Collective, the inverse: expert-major rows [ep_padded_rows(N), H] -> BF16 [slots, H] in this rank's plan order.
Tensor ep_from_experts(const CudaExpertParallel& ep, const EpDispatch& d, const Tensor& expert_rows, int64_t slots,
                       cudaStream_t stream, const std::string& what);

// --- all_gather mode ---

// Collective: each x [T, ...] (any dtype NCCL moves) -> [ep·T, ...], group rank j's rows at j·T; one NCCL
// group for all of them.
std::vector<Tensor> ep_all_gather_rows(const CudaExpertParallel& ep, const std::vector<Tensor>& xs,
                                       cudaStream_t stream, const std::string& what);
// Collective: partial [ep·T, ...] (BF16 or F32) -> [T, ...], the sum over the group of each rank's slice for
// this rank.
Tensor ep_reduce_scatter_rows(const CudaExpertParallel& ep, const Tensor& partial, cudaStream_t stream,
                              const std::string& what);
// Collectives on the side stream, started after the work queued on `stream` so far: `stream` may go on
// with other work; ep_join makes it wait for the results. One pending batch at a time.
struct EpPending {
  std::vector<Tensor> results;  // valid on `stream` after ep_join
  std::vector<Tensor> inputs;   // kept alive until the join (the allocator reuses freed blocks at once)
  bool pending = false;
};
// ep_reduce_scatter_rows of each partial ([T, ...] results).
EpPending ep_reduce_scatter_async(const CudaExpertParallel& ep, const std::vector<Tensor>& partials,
                                  cudaStream_t stream, const std::string& what);
// ep_all_gather_rows of xs ([ep·T, ...] results).
EpPending ep_all_gather_async(const CudaExpertParallel& ep, const std::vector<Tensor>& xs, cudaStream_t stream,
                              const std::string& what);
void ep_join(const CudaExpertParallel& ep, EpPending& p, cudaStream_t stream);
// The live row count of a local plan (its offsets[live_experts]), read on the host: one wait (bounded by the
// job's timeout), for a layer and micro-batch outside a budgeted step.
int64_t ep_live_rows(const CudaExpertParallel& ep, const Tensor& plan_offsets, int64_t live_experts,
                     cudaStream_t stream, const std::string& what);

}  // namespace mt
