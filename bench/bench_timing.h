// The kernel benches' short timing: an op queued `reps` times after a few warm-up calls, timed with CUDA events
// (the GPU near its boost clock; bench/sustained_run.h has the power-capped sustained mode).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/cuda_check.h"

namespace mt_bench {

// Mean milliseconds per call of f (queued on `stream`).
template <typename F>
double time_ms(int reps, cudaStream_t stream, F&& f, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  MT_CUDA_CHECK(cudaEventCreate(&a));
  MT_CUDA_CHECK(cudaEventCreate(&b));
  MT_CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) f();
  MT_CUDA_CHECK(cudaEventRecord(b, stream));
  MT_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  MT_CUDA_CHECK(cudaEventDestroy(a));
  MT_CUDA_CHECK(cudaEventDestroy(b));
  return ms / reps;
}

// The memory-bound kernels' floor: a device-to-device copy of 512 MiB, GB/s with read + write counted (its own
// buffers, freed before it returns).
inline double copy_rate_gbps(int reps, cudaStream_t stream) {
  const size_t bytes = size_t{512} << 20;
  void *src = nullptr, *dst = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&src, bytes));
  MT_CUDA_CHECK(cudaMalloc(&dst, bytes));
  MT_CUDA_CHECK(cudaMemsetAsync(src, 1, bytes, stream));
  const double ms = time_ms(reps, stream, [&] {
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  MT_CUDA_CHECK(cudaFree(src));
  MT_CUDA_CHECK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / ms * 1e-6;
}

}  // namespace mt_bench
