#include "kernels/cuda/device_context.h"

#include <memory>
#include <mutex>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"

namespace mt::cuda {

namespace {
constexpr int kMaxDevices = 64;
// cuBLASLt on Hopper wants 32 MiB to reach its best kernels (NVIDIA's recommendation for sm_90).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

std::mutex g_mutex;
// Never destroyed: the driver may already be unloading at static-destruction time.
DeviceContext* g_contexts[kMaxDevices] = {};
}  // namespace

int device_count() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for a CPU-only run
    return 0;
  }
  return n;
}

void device_set(int device) { MT_CUDA_CHECK(cudaSetDevice(device)); }

DeviceContext& device_context(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (device >= 0 && device < kMaxDevices && g_contexts[device]) {
    MT_CUDA_CHECK(cudaSetDevice(device));
    return *g_contexts[device];
  }
  const int n = device_count();
  if (device < 0 || device >= n)
    fail("cuda:{} requested but {} CUDA device(s) are visible", device, n);
  allocator_register();
  MT_CUDA_CHECK(cudaSetDevice(device));
  auto ctx = std::make_unique<DeviceContext>();
  ctx->device = device;
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  ctx->sm_count = prop.multiProcessorCount;
  ctx->cc_major = prop.major;
  ctx->cc_minor = prop.minor;
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
  MT_CUBLAS_CHECK(cublasLtCreate(&ctx->lt));
  ctx->workspace_bytes = kWorkspaceBytes;
  ctx->workspace = device_alloc(device, kWorkspaceBytes);
  g_contexts[device] = ctx.release();
  return *g_contexts[device];
}

void stream_sync(cudaStream_t stream) { MT_CUDA_CHECK(cudaStreamSynchronize(stream)); }

}  // namespace mt::cuda
