// Contract checks on the Tensor boundary of the CUDA ops (a caller bug if one fires): the tensor is
// defined, lives on a CUDA device, and has the expected dtype and shape.
#pragma once
#include "core/error.h"
#include "core/tensor.h"

namespace mt::cuda {

inline void check_device_tensor(const Tensor& t, const char* what, DType dtype, const Shape& shape) {
  MT_CHECK(t.defined(), "{} is undefined", what);
  MT_CHECK(t.device().is_cuda(), "{} must be on a CUDA device, found {}", what, t.device().str());
  MT_CHECK(t.dtype() == dtype && t.shape() == shape, "{}: expected {}{}, found {}", what, dtype_safetensors_name(dtype),
           shape_str(shape), t.desc());
}

// Same, accepting either of two dtypes.
inline void check_device_tensor2(const Tensor& t, const char* what, DType a, DType b, const Shape& shape) {
  MT_CHECK(t.defined(), "{} is undefined", what);
  MT_CHECK(t.device().is_cuda(), "{} must be on a CUDA device, found {}", what, t.device().str());
  MT_CHECK((t.dtype() == a || t.dtype() == b) && t.shape() == shape, "{}: expected {} or {} {}, found {}", what,
           dtype_safetensors_name(a), dtype_safetensors_name(b), shape_str(shape), t.desc());
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* what) {
  MT_CHECK(a.device() == b.device(), "{}: tensors on {} and {}", what, a.device().str(), b.device().str());
}

}  // namespace mt::cuda
