#include "kernels/cuda/cuda_check.h"

#include "core/error.h"

namespace mt::cuda {

void cuda_fail(cudaError_t e, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear a sticky-free error so the next call does not report it again
  fail("CUDA error at {}:{}: {}: {} ({})", file, line, expr, cudaGetErrorString(e), cudaGetErrorName(e));
}

void cublas_fail(cublasStatus_t s, const char* expr, const char* file, int line) {
  fail("cuBLAS error at {}:{}: {}: {} ({})", file, line, expr, cublasLtGetStatusString(s),
       cublasLtGetStatusName(s));
}

}  // namespace mt::cuda

namespace mt::cuda {
void require_fail(const char* file, int line, const char* expr, const std::string& msg) {
  fail("{} ({} failed at {}:{})", msg, expr, file, line);
}
}  // namespace mt::cuda
