// Per-device state of the CUDA backend: the compute stream every op runs on, the cuBLASLt handle
// and its workspace. Created on first use and kept for the life of the process.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace mt::cuda {

// Visible CUDA devices; 0 (never a crash or a throw) when there is no GPU or no usable driver.
int device_count();

struct DeviceContext {
  int device = 0;
  cudaStream_t stream = nullptr;   // non-blocking compute stream; all mixtune device work is ordered on it
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;       // cuBLASLt workspace (from the caching allocator)
  size_t workspace_bytes = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;  // compute capability
};

// The context of `device` (created on first use; makes it the calling thread's current device).
// Throws mt::Error when the device does not exist.
DeviceContext& device_context(int device = 0);

// Makes `device` current for the calling thread (cudaSetDevice), checked.
void device_set(int device);
// Waits for all work queued on `stream` (the one host sync a training step allows).
void stream_sync(cudaStream_t stream);

}  // namespace mt::cuda
