// Per-phase GPU time of a training step, measured with CUDA events recorded on the compute stream
// (no host sync while recording; read once after the step's sync). Disabled timers record nothing.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <vector>

namespace mt::cuda {

// comm: the expert-parallel all-to-alls and regroups; comm_plan: their row-count exchange (an all_gather and
// the host's wait for it, during which the GPU runs dry); grad_sync: the gradient all-reduce of a multi-GPU
// step; mlp: the dense MLP blocks (layers/cuda/mlp_block_cuda.h); mamba: the Mamba2 mixers
// (layers/cuda/mamba2_mixer_block_cuda.h). The NCCL kernels run on the compute stream.
enum class Phase { attention, experts, dispatch, head_loss, optimizer, comm_plan, comm, grad_sync, mlp, mamba, other };
constexpr int kPhaseCount = 11;
const char* phase_name(Phase p);

class PhaseTimer {
 public:
  PhaseTimer() = default;
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer();

  void enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // From now on (in stream order) GPU time counts towards `p`.
  void mark(Phase p, cudaStream_t stream);
  // Adds the time between consecutive marks to their phases and forgets the marks. The stream must
  // have passed the last mark (call after a sync). The interval after the last mark is not counted:
  // end a measured region with mark(Phase::other, ...).
  void collect();
  const std::array<double, kPhaseCount>& totals_ms() const { return totals_; }
  // Host time between the same marks (the enqueue cost of each phase, plus any wait inside it): where it
  // comes near the GPU time, the host's launch rate holds the GPU back.
  const std::array<double, kPhaseCount>& host_totals_ms() const { return host_totals_; }
  void reset_totals() { totals_.fill(0.0), host_totals_.fill(0.0); }
  // The tensors' peak (core/memory.h, bytes) as it stood when each phase last raised it, read on the host at the
  // marks and at collect() for the last phase:
  // allocations are made as the host enqueues, so the phase that set the run's peak is the one whose entry equals
  // it (the memory plan's checks: which block's activations or transients the plan misses).
  const std::array<int64_t, kPhaseCount>& peak_bytes_by_phase() const { return peak_by_phase_; }

 private:
  bool enabled_ = false;
  std::vector<cudaEvent_t> pool_;
  std::vector<Phase> phases_;  // phases_[i] starts at pool_[i]
  size_t used_ = 0;
  std::array<double, kPhaseCount> totals_{};
  std::array<double, kPhaseCount> host_totals_{};
  std::chrono::steady_clock::time_point last_host_{};
  std::array<int64_t, kPhaseCount> peak_by_phase_{};
  int64_t last_peak_ = 0;
};

}  // namespace mt::cuda
