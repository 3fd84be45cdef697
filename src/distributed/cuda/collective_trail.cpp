#include "distributed/cuda/collective_trail.h"

#include "kernels/cuda/cuda_check.h"

namespace mt {

CollectiveTrail::~CollectiveTrail() {
  for (Entry& e : pending_) cudaEventDestroy(e.event);
  for (cudaEvent_t ev : spare_) cudaEventDestroy(ev);
}

CollectiveTrail& CollectiveTrail::process() {
  static CollectiveTrail* trail = new CollectiveTrail();  // never destroyed: it may outlive the CUDA context
  return *trail;
}

void CollectiveTrail::drop_finished_front() {
  while (!pending_.empty() && cudaEventQuery(pending_.front().event) == cudaSuccess) {
    spare_.push_back(pending_.front().event);
    pending_.pop_front();
  }
}

void CollectiveTrail::record(cudaStream_t stream, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_finished_front();
  if (pending_.size() >= kMaxPending) {
    spare_.push_back(pending_.front().event);  // re-recording an event that has not fired is allowed
    pending_.pop_front();
  }
  cudaEvent_t ev = nullptr;
  if (!spare_.empty()) {
    ev = spare_.back();
    spare_.pop_back();
  } else {
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
  MT_CUDA_CHECK(cudaEventRecord(ev, stream));
  pending_.push_back({ev, what});
}

std::string CollectiveTrail::first_unfinished() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : pending_) {
    const cudaError_t q = cudaEventQuery(e.event);
    if (q == cudaErrorNotReady) return e.what;
    if (q != cudaSuccess) cudaGetLastError();  // a failed context: keep looking, the caller is reporting anyway
  }
  return "";
}

size_t CollectiveTrail::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

}  // namespace mt
