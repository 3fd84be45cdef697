#include "train/cuda/cuda_param_transport.h"

#include "core/error.h"
#include "distributed/cuda/device_communicator.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"

namespace mt {

CudaParamTransport::CudaParamTransport(DeviceCommunicator& world, int device, DeviceCommunicator* replicas)
    : world_(world), device_(device), replicas_(replicas) {
  cuda::device_set(device_);
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
}

CudaParamTransport::~CudaParamTransport() {
  for (auto& [g, e] : pending_) free_.push_back(e);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
  if (side_) cudaStreamDestroy(side_);
}

cudaEvent_t CudaParamTransport::event() {
  if (free_.empty()) {
    cudaEvent_t e = nullptr;
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  cudaEvent_t e = free_.back();
  free_.pop_back();
  return e;
}

void CudaParamTransport::bring(int64_t group, const std::vector<ShardedParam>& members, const std::string& what) {
  MT_CHECK(!pending_.count(group), "{}: brought again before it was joined", what);
  cudaStream_t main = cuda::device_context(device_).stream;
  // The tensors just allocated for this group may be blocks the main stream's queued work still uses
  // (device_allocator.h: reuse is safe in the main stream's order), so the broadcast starts after it.
  cudaEvent_t fork = event();
  MT_CUDA_CHECK(cudaEventRecord(fork, main));
  MT_CUDA_CHECK(cudaStreamWaitEvent(side_, fork, 0));
  free_.push_back(fork);  // reusable at once: a later record does not disturb this wait
  std::vector<DeviceCommunicator::Broadcast> parts, stacks;
  for (const ShardedParam& m : members)
    (m.over_replicas ? stacks : parts).push_back({m.t->data(), m.t->numel(), m.t->dtype(), m.root});
  if (!parts.empty()) world_.broadcast(parts, side_, "broadcast(" + what + ": parameters from their owners)");
  if (!stacks.empty()) {
    MT_CHECK(replicas_, "{}: expert stacks sharded over replicas, but no replica communicator", what);
    replicas_->broadcast(stacks, side_, "broadcast(" + what + ": expert stacks from their owners among the replicas)");
  }
  cudaEvent_t done = event();
  MT_CUDA_CHECK(cudaEventRecord(done, side_));
  pending_[group] = done;
}

void CudaParamTransport::join(int64_t group) {
  const auto it = pending_.find(group);
  if (it == pending_.end()) return;
  MT_CUDA_CHECK(cudaStreamWaitEvent(cuda::device_context(device_).stream, it->second, 0));
  free_.push_back(it->second);
  pending_.erase(it);
}

}  // namespace mt
