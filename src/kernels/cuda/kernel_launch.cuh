// Kernel launches with programmatic dependent launch (PDL, compute capability 9.0+).
//
// A kernel launched in stream order normally starts only after the previous kernel has fully drained; the
// GPU then spends ~1.3-1.9 µs per boundary launching the next grid (bench/launch_gap_bench.cu measured
// 4.97 → 3.23 µs per empty kernel and 7.52 → 6.26 µs per 16 MiB copy on an H200). With the
// programmatic-stream-serialization attribute the next grid is launched while the previous one drains,
// and each of its threads waits in `griddepcontrol.wait` until the previous grids have completed and their
// writes are visible. So every kernel launched through launch_kernel() must call pdl_wait() before it
// reads or writes global memory; every kernel of this backend calls it first thing. Without PDL (older
// GPUs, MIXTUNE_PDL=0) the wait is a no-op and the launch is an ordinary one.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace mt::cuda {

// Whether launch_kernel() asks for PDL: the current device is of compute capability 9.0 or newer, and the
// environment does not say MIXTUNE_PDL=0. Decided once per process, unless pdl_set_enabled() overrides it.
bool pdl_enabled();
// Tests: force PDL on (1; still needs a 9.0+ device) or off (0), or back to the default (-1).
void pdl_set_enabled(int on_off_or_default);

#if defined(__CUDACC__)
// First statement of every kernel: waits for the grids this one depends on (no-op without PDL).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL when pdl_enabled(). Throws on a bad launch.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
#endif

}  // namespace mt::cuda
