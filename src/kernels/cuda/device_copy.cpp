#include "kernels/cuda/device_copy.h"

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"

namespace mt::cuda {

Tensor to_device(const Tensor& host, int device) {
  MT_CHECK(host.defined() && host.device().is_cpu(), "to_device expects a host tensor, got {} on {}",
           host.defined() ? host.desc() : "undefined", host.device().str());
  DeviceContext& ctx = device_context(device);
  Tensor t = Tensor::empty(host.shape(), host.dtype(), Device::cuda(device));
  if (host.nbytes() == 0) return t;
  MT_CUDA_CHECK(cudaMemcpyAsync(t.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, ctx.stream));
  stream_sync(ctx.stream);
  return t;
}

Tensor to_host(const Tensor& dev) {
  MT_CHECK(dev.defined() && dev.device().is_cuda(), "to_host expects a CUDA tensor, got {} on {}",
           dev.defined() ? dev.desc() : "undefined", dev.device().str());
  DeviceContext& ctx = device_context(dev.device().index);
  Tensor t = Tensor::empty(dev.shape(), dev.dtype());
  if (dev.nbytes() == 0) {
    stream_sync(ctx.stream);
    return t;
  }
  MT_CUDA_CHECK(cudaMemcpyAsync(t.data(), dev.data(), dev.nbytes(), cudaMemcpyDeviceToHost, ctx.stream));
  stream_sync(ctx.stream);
  return t;
}

void copy_async(Tensor& dst, const Tensor& src, cudaStream_t stream) {
  MT_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(), "copy {} into {}", src.desc(), dst.desc());
  MT_CHECK(dst.device().is_cuda() && src.device() == dst.device(), "device copy from {} to {}",
           src.device().str(), dst.device().str());
  if (dst.nbytes() == 0) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream));
}

void copy_host_to_device(Tensor& dst, const Tensor& host) {
  MT_CHECK(dst.shape() == host.shape() && dst.dtype() == host.dtype(), "copy {} into {}", host.desc(), dst.desc());
  MT_CHECK(dst.device().is_cuda() && host.device().is_cpu(), "host-to-device copy from {} to {}",
           host.device().str(), dst.device().str());
  if (dst.nbytes() == 0) return;
  DeviceContext& ctx = device_context(dst.device().index);
  MT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host.data(), dst.nbytes(), cudaMemcpyHostToDevice, ctx.stream));
  stream_sync(ctx.stream);
}

void copy_device_to_host(Tensor& host, const Tensor& dev) {
  MT_CHECK(dev.shape() == host.shape() && dev.dtype() == host.dtype(), "copy {} into {}", dev.desc(), host.desc());
  MT_CHECK(dev.device().is_cuda() && host.device().is_cpu(), "device-to-host copy from {} to {}",
           dev.device().str(), host.device().str());
  if (dev.nbytes() == 0) return;
  DeviceContext& ctx = device_context(dev.device().index);
  MT_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev.data(), dev.nbytes(), cudaMemcpyDeviceToHost, ctx.stream));
  stream_sync(ctx.stream);
}

void fill_zero_async(Tensor& t, cudaStream_t stream) {
  MT_CHECK(t.device().is_cuda(), "fill_zero_async on {}", t.device().str());
  if (t.nbytes() == 0) return;
  MT_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream));
}

}  // namespace mt::cuda
