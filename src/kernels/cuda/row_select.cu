#include "kernels/cuda/row_select.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

// Copies unit u of row i: dst row (SCATTER ? rows[i] : i) = src row (SCATTER ? i : rows[i]). U is the widest
// unit the row length and both base addresses allow (16 bytes for bf16 rows of 8n elements).
template <typename U, bool SCATTER>
__global__ void rows_copy_kernel(const U* __restrict__ src, const int32_t* __restrict__ rows, U* __restrict__ dst,
                                 int64_t R, int64_t units) {
  pdl_wait();
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < R * units;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / units, u = k - i * units, r = rows[i];
    if (SCATTER)
      dst[r * units + u] = src[i * units + u];
    else
      dst[i * units + u] = src[r * units + u];
  }
}

template <bool SCATTER>
void rows_copy(const void* src, const int32_t* rows, void* dst, int64_t R, int64_t row_bytes, cudaStream_t stream) {
  if (R == 0 || row_bytes == 0) return;
  const bool v16 = row_bytes % 16 == 0 && aligned16(src) && aligned16(dst);
  const bool v4 = row_bytes % 4 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 4 == 0;
  const int64_t unit = v16 ? 16 : v4 ? 4 : 1, units = row_bytes / unit;
  const unsigned blocks = std::min<unsigned>(blocks_for(R * units, 256), 65535u * 8);
  if (v16)
    launch_kernel(rows_copy_kernel<uint4, SCATTER>, blocks, 256, 0, stream, static_cast<const uint4*>(src), rows,
        static_cast<uint4*>(dst), R, units);
  else if (v4)
    launch_kernel(rows_copy_kernel<uint32_t, SCATTER>, blocks, 256, 0, stream, static_cast<const uint32_t*>(src), rows,
        static_cast<uint32_t*>(dst), R, units);
  else
    launch_kernel(rows_copy_kernel<unsigned char, SCATTER>, blocks, 256, 0, stream,
        static_cast<const unsigned char*>(src), rows, static_cast<unsigned char*>(dst), R, units);
}

// Both tensors on one device with the same dtype and row length; rows I32 [R].
void check_rows(const char* op, const Tensor& full, const Tensor& rows, const Tensor& part) {
  MT_CUDA_REQUIRE(full.defined() && full.device().is_cuda() && full.ndim() >= 1,
                  std::string(op) + ": expected a CUDA tensor of rows, got " + tensor_where(full));
  const int dev = full.device().index;
  MT_CUDA_REQUIRE(rows.defined() && rows.ndim() == 1,
                  std::string(op) + ": rows must be I32 [R], got " + tensor_where(rows));
  const int64_t R = rows.dim(0), T = full.dim(0), C = T > 0 ? full.numel() / T : 0;
  check_tensor(rows, op, dev, DType::I32, R);
  check_tensor(part, op, dev, full.dtype(), R * C);
  MT_CUDA_REQUIRE(part.ndim() >= 1 && part.dim(0) == R && R <= T,
                  std::string(op) + ": " + tensor_where(part) + " must hold " + std::to_string(R) + " of the " +
                      std::to_string(T) + " rows of " + tensor_where(full));
}

}  // namespace

void rows_gather(const Tensor& src, const Tensor& rows, Tensor& out, cudaStream_t stream) {
  check_rows("rows_gather", src, rows, out);
  const int64_t T = src.dim(0), row_bytes = T > 0 ? static_cast<int64_t>(src.nbytes()) / T : 0;
  rows_copy<false>(src.data(), rows.data_as<int32_t>(), out.data(), rows.dim(0), row_bytes, stream);
}

void rows_scatter(const Tensor& src, const Tensor& rows, Tensor& out, cudaStream_t stream) {
  check_rows("rows_scatter", out, rows, src);
  const int64_t T = out.dim(0), row_bytes = T > 0 ? static_cast<int64_t>(out.nbytes()) / T : 0;
  if (out.nbytes() > 0) MT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.nbytes(), stream));
  rows_copy<true>(src.data(), rows.data_as<int32_t>(), out.data(), rows.dim(0), row_bytes, stream);
}

}  // namespace mt::cuda
