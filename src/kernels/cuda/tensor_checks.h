// Contract checks on the Tensor boundary of the CUDA ops (nvcc-safe: no fmt). A failure is a caller
// bug and throws mt::Error naming the op, the tensor and what was expected.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"

namespace mt::cuda {

inline std::string tensor_where(const Tensor& t) {
  return t.defined() ? t.desc() + " on " + t.device().str() : std::string("undefined tensor");
}

// t is defined, on cuda:`device`, of dtype dt and has `numel` elements.
inline void check_tensor(const Tensor& t, const char* what, int device, DType dt, int64_t numel) {
  MT_CUDA_REQUIRE(t.defined() && t.device() == Device::cuda(device) && t.dtype() == dt && t.numel() == numel,
                  std::string(what) + ": expected " + std::string(dtype_safetensors_name(dt)) + " with " +
                      std::to_string(numel) + " elements on cuda:" + std::to_string(device) + ", got " +
                      tensor_where(t));
}

// The activation dtypes the kernels are built for: BF16 (HF bf16 rounding) or F32.
inline void check_float_dtype(const Tensor& t, const char* what) {
  MT_CUDA_REQUIRE(t.defined() && t.device().is_cuda() && (t.dtype() == DType::BF16 || t.dtype() == DType::F32),
                  std::string(what) + ": expected a BF16 or F32 CUDA tensor, got " + tensor_where(t));
}

// 16-byte aligned (vector loads, TMA, bulk copies); null counts as aligned (an absent optional operand).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline bool aligned16(const Tensor& t) { return aligned16(t.data()); }

// The kernel-choice switches (MIXTUNE_GROUPED_GEMM, MIXTUNE_FLASH_FWD, MIXTUNE_FLASH_BWD): true unless the
// variable says "mma" (the mma.sync kernels, for A/B measurements). Callers read it once.
inline bool env_allows_sm90(const char* var) {
  const char* e = std::getenv(var);
  return e == nullptr || std::strcmp(e, "mma") != 0;
}

}  // namespace mt::cuda
