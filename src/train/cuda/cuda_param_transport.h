// ZeRO-3's transport on the GPUs (train/sharded_params.h): a group's tensors travel in one grouped device
// broadcast (each tensor from its owner) over the world, and its expert stacks in one over their replicas,
// on a side stream that first waits for the main stream's work so far, so the next layer's parameters move
// while this layer computes; join() makes the main stream wait for that group's broadcasts before anything
// reads it. The side stream is the only one that queues on these communicators during a forward or backward
// (the gradient reductions come after the last join), so neither has work on two streams at once.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "train/sharded_params.h"

namespace mt {

class DeviceCommunicator;

class CudaParamTransport final : public ParamTransport {
 public:
  // world: the job's communicator over every rank (the ZeRO-1 owners' ranks); device: this rank's GPU;
  // replicas: the communicator over the ranks holding this rank's experts (null: no stack travels over it).
  CudaParamTransport(DeviceCommunicator& world, int device, DeviceCommunicator* replicas = nullptr);
  ~CudaParamTransport() override;
  CudaParamTransport(const CudaParamTransport&) = delete;
  CudaParamTransport& operator=(const CudaParamTransport&) = delete;

  void bring(int64_t group, const std::vector<ShardedParam>& members, const std::string& what) override;
  void join(int64_t group) override;

 private:
  cudaEvent_t event();  // a free event from the pool

  DeviceCommunicator& world_;
  int device_;
  DeviceCommunicator* replicas_ = nullptr;
  cudaStream_t side_ = nullptr;
  std::map<int64_t, cudaEvent_t> pending_;  // group -> its broadcast's completion, until joined
  std::vector<cudaEvent_t> free_;
};

}  // namespace mt
