// Error checks for CUDA runtime and cuBLASLt calls: a failure throws mt::Error naming the call,
// file:line and the library's error string, e.g.
//   "CUDA error at src/kernels/cuda/x.cu:12: cudaMalloc(&p, n): out of memory (cudaErrorMemoryAllocation)".
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

namespace mt::cuda {

[[noreturn]] void cuda_fail(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void cublas_fail(cublasStatus_t s, const char* expr, const char* file, int line);

inline void cuda_check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess) cuda_fail(e, expr, file, line);
}
inline void cublas_check(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) cublas_fail(s, expr, file, line);
}

}  // namespace mt::cuda

#define MT_CUDA_CHECK(expr) ::mt::cuda::cuda_check((expr), #expr, __FILE__, __LINE__)
#define MT_CUBLAS_CHECK(expr) ::mt::cuda::cublas_check((expr), #expr, __FILE__, __LINE__)

namespace mt::cuda {
// Contract checks usable in .cu files (nvcc cannot compile fmt's consteval format strings, so the
// .cu files do not include core/error.h): throws mt::Error "<msg> (<expr> failed at file:line)".
[[noreturn]] void require_fail(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace mt::cuda

#define MT_CUDA_REQUIRE(cond, msg)                                                     \
  do {                                                                                 \
    if (!(cond)) ::mt::cuda::require_fail(__FILE__, __LINE__, #cond, (msg));           \
  } while (0)

namespace mt::cuda {
// The opt-in shared memory per block of the calling thread's current device (bytes).
inline size_t smem_optin_bytes() {
  int dev = 0, optin = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return static_cast<size_t>(optin);
}
// A kernel configuration larger than that fails here with the numbers ("<what> needs N bytes of shared
// memory per block; device D allows M"), not with cudaFuncSetAttribute's "invalid argument".
inline void require_smem_fits(size_t bytes, const std::string& what) {
  const size_t optin = smem_optin_bytes();
  if (bytes <= optin) return;
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CUDA_REQUIRE(bytes <= optin, what + " needs " + std::to_string(bytes) +
                                      " bytes of shared memory per block; device " + std::to_string(dev) +
                                      " allows " + std::to_string(optin));
}
}  // namespace mt::cuda
