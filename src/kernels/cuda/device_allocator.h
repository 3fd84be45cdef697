// Caching device allocator: freed blocks go to a per-device free list and are reused by later
// allocations of (nearly) the same size, so a training step after the first calls cudaMalloc rarely
// and never cudaFree (which would synchronise the device). It is registered as the core Tensor's CUDA
// allocator, so Tensor::empty(shape, dtype, Device::cuda(i)) allocates here.
//
// Stream contract: every mixtune kernel runs on its device context's stream, so a block freed on the
// host and reused for the next allocation is only touched again in stream order. Work on another
// stream must finish (or be fenced with an event) before its tensors are released.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mt::cuda {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // bytes of blocks handed out (size-class rounded)
  int64_t reserved_bytes = 0;        // bytes obtained from cudaMalloc (allocated + cached)
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t cuda_malloc_calls = 0;
  int64_t cache_hits = 0;
  int64_t cache_releases = 0;        // times the cache was returned to the driver to satisfy a miss
};

// Raw interface (what Tensor storage uses). device_alloc throws mt::Error on out-of-memory after
// releasing the cache once, naming the device, the request and the allocator's totals.
void* device_alloc(int device, size_t nbytes);
void device_free(int device, void* p);  // never throws

AllocatorStats allocator_stats(int device);
void allocator_reset_peak(int device);
// Returns every cached (unused) block to the driver. Synchronises the device.
void allocator_empty_cache(int device);
// A miss while more than `bytes` sit cached returns the cache to the driver first (a device sync); 4 GiB
// unless set. Raised by the multi-GPU engines, whose allocation sizes change from step to step.
void allocator_set_release_threshold(int device, size_t bytes);
// Registers device_alloc/device_free with core/tensor (idempotent; also done at program start).
void allocator_register();

}  // namespace mt::cuda
