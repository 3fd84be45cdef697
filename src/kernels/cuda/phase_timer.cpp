#include "kernels/cuda/phase_timer.h"

#include "core/memory.h"
#include "kernels/cuda/cuda_check.h"

namespace mt::cuda {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::attention: return "attention";
    case Phase::experts: return "experts";
    case Phase::dispatch: return "dispatch";
    case Phase::head_loss: return "head_loss";
    case Phase::optimizer: return "optimizer";
    case Phase::comm_plan: return "comm_plan";
    case Phase::comm: return "comm";
    case Phase::grad_sync: return "grad_sync";
    case Phase::mlp: return "mlp";
    case Phase::mamba: return "mamba";
    case Phase::other: return "other";
  }
  return "other";
}

PhaseTimer::~PhaseTimer() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

void PhaseTimer::mark(Phase p, cudaStream_t stream) {
  if (!enabled_) return;
  if (used_ == pool_.size()) {
    cudaEvent_t e;
    MT_CUDA_CHECK(cudaEventCreate(&e));
    pool_.push_back(e);
    phases_.push_back(p);
  }
  const auto now = std::chrono::steady_clock::now();
  if (used_ > 0) {
    const int prev = static_cast<int>(phases_[used_ - 1]);
    host_totals_[prev] += std::chrono::duration<double, std::milli>(now - last_host_).count();
    int dev = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    const int64_t peak = memory_stats(Device::cuda(dev)).peak_bytes;
    if (peak > last_peak_) {  // the phase that ends here raised the peak
      peak_by_phase_[prev] = peak;
      last_peak_ = peak;
    }
  }
  last_host_ = now;
  phases_[used_] = p;
  MT_CUDA_CHECK(cudaEventRecord(pool_[used_], stream));
  ++used_;
}

void PhaseTimer::collect() {
  if (used_ > 0) {  // the last phase's raise of the peak (no mark follows it)
    int dev = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    const int64_t peak = memory_stats(Device::cuda(dev)).peak_bytes;
    if (peak > last_peak_) {
      peak_by_phase_[static_cast<int>(phases_[used_ - 1])] = peak;
      last_peak_ = peak;
    }
  }
  for (size_t i = 0; i + 1 < used_; ++i) {
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, pool_[i], pool_[i + 1]));
    totals_[static_cast<int>(phases_[i])] += ms;
  }
  used_ = 0;
}

}  // namespace mt::cuda
