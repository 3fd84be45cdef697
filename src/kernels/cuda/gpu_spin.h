// A kernel that keeps a stream busy for a given time. The benches queue it ahead of a timed burst so the
// host has queued every call of the burst before the GPU starts it: the events then time the GPU's work,
// not the host's enqueue rate.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mt::cuda {

// One block of one thread that returns after `ns` nanoseconds of the SM's global timer.
void gpu_spin(int64_t ns, cudaStream_t stream);

}  // namespace mt::cuda
