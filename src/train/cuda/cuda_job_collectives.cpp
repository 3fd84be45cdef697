#include "train/cuda/cuda_job_collectives.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/error.h"
#include "distributed/communicator.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"

namespace mt {

CudaStepCollectives CudaJobCollectives::step() const {
  CudaStepCollectives c;
  c.host = host;
  c.world = world.get();
  c.expert_replicas = replicas.get();
  c.ep = ep.get();
  return c;
}

CudaJobCollectives cuda_job_collectives_create(Communicator& host, int device, std::chrono::milliseconds timeout,
                                               int64_t ep, int64_t experts, EpDispatchMode dispatch,
                                               const char* what, DeviceCollectives kind) {
  const int world = host.size();
  if (ep < 1 || world % ep != 0) fail("{}: {} does not divide the {} ranks of this job", what, ep, world);
  if (experts % ep != 0) fail("{}: {} does not divide the model's {} experts", what, ep, experts);
  CudaJobCollectives c;
  c.host = &host;
  c.world = device_communicator_create(kind, host, device, timeout);
  size_t free_b = 0, total_b = 0;
  MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  cuda::allocator_set_release_threshold(device, std::max<size_t>(size_t{4} << 30, total_b / 4));
  if (ep > 1) {
    c.ep_comm = device_communicator_create(kind, host, device, timeout, expert_parallel_groups(world, ep),
                                               "expert-parallel group");
    if (world > ep)
      c.replicas = device_communicator_create(kind, host, device, timeout, expert_replica_groups(world, ep),
                                                  "expert replicas");
    c.ep = std::make_unique<CudaExpertParallel>(*c.ep_comm, experts, dispatch);
  }
  return c;
}

}  // namespace mt
