// Moving tensors between host and device, and the small device-side tensor utilities that the
// core Tensor (CPU-only for clone/fill/copy) does not provide.
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

// Host tensor -> new tensor on cuda:`device`, same shape and dtype. Waits for the copy (the host
// buffer may be released right after).
Tensor to_device(const Tensor& host, int device = 0);
// Device tensor -> new host tensor, same shape and dtype. Waits for the copy and for all earlier
// work on the device's stream.
Tensor to_host(const Tensor& dev);

// dst <- src on the device (same shape and dtype, both on one device), queued on `stream`.
void copy_async(Tensor& dst, const Tensor& src, cudaStream_t stream);
// Into an existing tensor (same shape and dtype), waiting for the copy: host -> device, device -> host.
void copy_host_to_device(Tensor& dst, const Tensor& host);
void copy_device_to_host(Tensor& host, const Tensor& dev);
// Sets every byte of a device tensor to 0, queued on `stream`.
void fill_zero_async(Tensor& t, cudaStream_t stream);

}  // namespace mt::cuda
