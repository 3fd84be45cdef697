#include "kernels/cuda/gpu_spin.h"

#include "kernels/cuda/cuda_check.h"

namespace mt::cuda {

namespace {

__global__ void gpu_spin_kernel(int64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<int64_t>(now - start) < ns);
}

}  // namespace

void gpu_spin(int64_t ns, cudaStream_t stream) {
  gpu_spin_kernel<<<1, 1, 0, stream>>>(ns);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
