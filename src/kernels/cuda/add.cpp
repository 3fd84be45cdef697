#include "kernels/cuda/add.h"

#include "core/error.h"
#include "kernels/cuda/add_kernels.h"
#include "kernels/cuda/device_tensor_check.h"

namespace mt::cuda {

void add(const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t stream) {
  MT_CHECK(a.defined() && (a.dtype() == DType::BF16 || a.dtype() == DType::F32), "add: a must be BF16 or F32");
  check_device_tensor(a, "add a", a.dtype(), a.shape());
  check_device_tensor(b, "add b", a.dtype(), a.shape());
  check_device_tensor(out, "add out", a.dtype(), a.shape());
  check_same_device(a, b, "add");
  check_same_device(a, out, "add");
  detail::add_launch(a.data(), b.data(), out.data(), a.numel(), a.dtype() == DType::BF16, stream);
}

}  // namespace mt::cuda
