// The GPU side of a multi-GPU job (NCCL, or staged through the host: distributed/cuda/device_communicator.h), shared by the CUDA training engine and `mixtune bench`: one
// communicator over every rank and, with expert parallelism, the expert-parallel groups (consecutive ranks,
// as the CPU engine forms them) and the groups of ranks holding the same experts. Creating it also raises the
// device allocator's cache-release threshold (kernels/cuda/device_allocator.h): a multi-GPU step's buffer
// sizes change from step to step.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>

#include "distributed/cuda/device_communicator.h"
#include "layers/cuda/expert_parallel_cuda.h"
#include "train/cuda/cuda_train_step.h"

namespace mt {

class Communicator;

struct CudaJobCollectives {
  Communicator* host = nullptr;
  std::unique_ptr<DeviceCommunicator> world, ep_comm, replicas;
  std::unique_ptr<CudaExpertParallel> ep;  // null without expert parallelism
  CudaStepCollectives step() const;
};

// Collective over every rank of `host` (more than one). ep: the expert-parallel group size (1: none);
// `what` names the setting in errors ("parallel.ep", "--ep"). Throws for an ep that does not divide the
// ranks or the model's `experts`. dispatch: the EP dispatch mode (ep_dispatch_mode_parse); kind: NCCL or
// host-staged collectives (recipe parallel.gpu_collectives).
CudaJobCollectives cuda_job_collectives_create(Communicator& host, int device, std::chrono::milliseconds timeout,
                                               int64_t ep, int64_t experts, EpDispatchMode dispatch,
                                               const char* what, DeviceCollectives kind = DeviceCollectives::nccl);

}  // namespace mt
