// The collectives a process has queued on its GPU and not yet seen finish, in queue order, with their names.
// A training step queues every layer's collectives without waiting (the expert rows need no host read,
// distributed/ep_row_budget.h), so when a peer stops, the wait that times out is the step's own sync, which
// names only the step. The trail names the operation the job is stuck in: the first one queued that has not
// completed ("layer 0: all_gather(tokens and routing, forward)"). One CUDA event per collective, recorded
// on its stream after it; finished ones are dropped as new ones come.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace mt {

class CollectiveTrail {
 public:
  CollectiveTrail() = default;
  ~CollectiveTrail();
  CollectiveTrail(const CollectiveTrail&) = delete;
  CollectiveTrail& operator=(const CollectiveTrail&) = delete;

  // The one every communicator of this process records into (a hang in one group's collective shows in
  // another group's wait).
  static CollectiveTrail& process();

  // After queueing the collective `what` on `stream` (the current device's).
  void record(cudaStream_t stream, const std::string& what);
  // The earliest-queued collective that has not completed; "" when every one has.
  std::string first_unfinished();
  size_t pending() const;

  // At most this many are kept: past it the oldest is forgotten (a job this far behind is named by its newer ones).
  static constexpr size_t kMaxPending = 4096;

 private:
  struct Entry {
    cudaEvent_t event;
    std::string what;
  };
  void drop_finished_front();
  mutable std::mutex mu_;
  std::deque<Entry> pending_;
  std::vector<cudaEvent_t> spare_;
};

}  // namespace mt
