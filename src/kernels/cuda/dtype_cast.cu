#include "kernels/cuda/dtype_cast.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

template <typename S, typename D>
__global__ void cast_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  pdl_wait();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    Elt<D>::store(dst, i, Elt<S>::load(src, i));
}

template <typename S, typename D>
void launch(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  const int64_t n = src.numel();
  const unsigned blocks = std::min<unsigned>(blocks_for(n, 256), 65535u * 8);
  launch_kernel(cast_kernel<S, D>, blocks, 256, 0, stream, static_cast<const S*>(src.data()),
                static_cast<D*>(dst.data()), n);
}

}  // namespace

void cast_async(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  check_float_dtype(src, "cast source");
  check_float_dtype(dst, "cast destination");
  MT_CUDA_REQUIRE(src.device() == dst.device() && src.numel() == dst.numel(),
                  "cast: " + tensor_where(src) + " into " + tensor_where(dst));
  if (src.numel() == 0) return;
  const bool s16 = src.dtype() == DType::BF16, d16 = dst.dtype() == DType::BF16;
  if (s16 && d16) launch<bf16, bf16>(src, dst, stream);
  else if (s16) launch<bf16, float>(src, dst, stream);
  else if (d16) launch<float, bf16>(src, dst, stream);
  else launch<float, float>(src, dst, stream);
}

}  // namespace mt::cuda
