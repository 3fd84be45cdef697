#include "kernels/cuda/embedding.h"

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

template <typename I, typename T>
__global__ void embedding_forward_kernel(const I* __restrict__ ids, const T* __restrict__ table, T* __restrict__ out,
                                         int64_t N, int64_t H, int64_t V) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * H) return;
  const int64_t t = i / H, h = i - t * H;
  const int64_t id = static_cast<int64_t>(ids[t]);
  out[i] = (id >= 0 && id < V) ? table[id * H + h] : T(0.0f);
}

// Sort keys: the id, or V for an out-of-range id or the padding index `pad` (-1: none) (sorted last, then
// skipped). Values: token index.
template <typename I>
__global__ void embedding_keys_kernel(const I* __restrict__ ids, uint32_t* keys, int32_t* vals, int64_t N, int64_t V,
                                      int64_t pad) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const int64_t id = static_cast<int64_t>(ids[i]);
  keys[i] = (id >= 0 && id < V && id != pad) ? static_cast<uint32_t>(id) : static_cast<uint32_t>(V);
  vals[i] = static_cast<int32_t>(i);
}

// Block p handles the run of equal keys starting at sorted position p (other blocks exit): each
// thread owns columns and sums the run's rows in token order (the sort is stable).
template <typename T>
__global__ void embedding_backward_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ vals,
                                          const T* __restrict__ dout, float* dtable, int64_t N, int64_t H, int64_t V) {
  pdl_wait();
  const int64_t p = blockIdx.x;
  const uint32_t key = keys[p];
  if (key >= V || (p > 0 && keys[p - 1] == key)) return;
  int64_t end = p + 1;
  while (end < N && keys[end] == key) ++end;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float s = 0.0f;
    for (int64_t q = p; q < end; ++q) s += Elt<T>::load(dout, static_cast<int64_t>(vals[q]) * H + h);
    dtable[static_cast<int64_t>(key) * H + h] += s;
  }
}

void check_ids(const Tensor& ids, const char* op) {
  MT_CUDA_REQUIRE(ids.defined() && ids.device().is_cuda() && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
                  std::string(op) + ": ids must be I64 or I32 on a CUDA device, got " + tensor_where(ids));
}

int bits_for(int64_t v) {  // bits needed to hold every value in [0, v]
  int b = 1;
  while (b < 32 && (int64_t{1} << b) <= v) ++b;
  return b;
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, cudaStream_t stream) {
  const char* op = "embedding_forward";
  check_ids(ids, op);
  check_float_dtype(table, op);
  MT_CUDA_REQUIRE(table.ndim() == 2, std::string(op) + ": table must be [V, H], got " + tensor_where(table));
  const int dev = ids.device().index;
  const int64_t N = ids.numel(), V = table.dim(0), H = table.dim(1);
  check_tensor(table, op, dev, table.dtype(), V * H);
  check_tensor(out, op, dev, table.dtype(), N * H);
  if (N * H == 0) return;
  const unsigned blocks = blocks_for(N * H, 256);
  const bool i64 = ids.dtype() == DType::I64;
  if (table.dtype() == DType::BF16) {
    if (i64)
      launch_kernel(embedding_forward_kernel<int64_t, bf16>, blocks, 256, 0, stream, ids.data_as<int64_t>(),
          table.data_as<bf16>(), out.data_as<bf16>(), N, H, V);
    else
      launch_kernel(embedding_forward_kernel<int32_t, bf16>, blocks, 256, 0, stream, ids.data_as<int32_t>(),
          table.data_as<bf16>(), out.data_as<bf16>(), N, H, V);
  } else {
    if (i64)
      launch_kernel(embedding_forward_kernel<int64_t, float>, blocks, 256, 0, stream, ids.data_as<int64_t>(),
          table.data_as<float>(), out.data_as<float>(), N, H, V);
    else
      launch_kernel(embedding_forward_kernel<int32_t, float>, blocks, 256, 0, stream, ids.data_as<int32_t>(),
          table.data_as<float>(), out.data_as<float>(), N, H, V);
  }
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, std::optional<int64_t> padding_idx,
                        cudaStream_t stream) {
  const char* op = "embedding_backward";
  check_ids(ids, op);
  check_float_dtype(dout, op);
  MT_CUDA_REQUIRE(dtable.ndim() == 2, std::string(op) + ": dtable must be F32 [V, H], got " + tensor_where(dtable));
  const int dev = ids.device().index;
  const int64_t N = ids.numel(), V = dtable.dim(0), H = dtable.dim(1);
  MT_CUDA_REQUIRE(V < (int64_t{1} << 31) - 1 && N < (int64_t{1} << 31),
                  std::string(op) + ": vocabulary or token count exceeds 2^31");
  check_tensor(dtable, op, dev, DType::F32, V * H);
  check_tensor(dout, op, dev, dout.dtype(), N * H);
  MT_CUDA_REQUIRE(!padding_idx || (*padding_idx >= 0 && *padding_idx < V),
                  std::string(op) + ": padding_idx " + std::to_string(padding_idx.value_or(0)) + " outside [0, " +
                      std::to_string(V) + ")");
  const int64_t pad = padding_idx.value_or(-1);  // -1 matches no id
  if (N == 0 || H == 0) return;
  const Device d = Device::cuda(dev);
  Tensor keys = Tensor::empty({N}, DType::U32, d), vals = Tensor::empty({N}, DType::I32, d);
  Tensor keys_sorted = Tensor::empty({N}, DType::U32, d), vals_sorted = Tensor::empty({N}, DType::I32, d);
  if (ids.dtype() == DType::I64)
    launch_kernel(embedding_keys_kernel<int64_t>, blocks_for(N, 256), 256, 0, stream, ids.data_as<int64_t>(),
        keys.data_as<uint32_t>(), vals.data_as<int32_t>(), N, V, pad);
  else
    launch_kernel(embedding_keys_kernel<int32_t>, blocks_for(N, 256), 256, 0, stream, ids.data_as<int32_t>(),
        keys.data_as<uint32_t>(), vals.data_as<int32_t>(), N, V, pad);
  const int end_bit = bits_for(V);
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys.data_as<uint32_t>(),
                                                keys_sorted.data_as<uint32_t>(), vals.data_as<int32_t>(),
                                                vals_sorted.data_as<int32_t>(), static_cast<int>(N), 0, end_bit, stream));
  Tensor temp = Tensor::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::U8, d);
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, keys.data_as<uint32_t>(),
                                                keys_sorted.data_as<uint32_t>(), vals.data_as<int32_t>(),
                                                vals_sorted.data_as<int32_t>(), static_cast<int>(N), 0, end_bit, stream));
  const unsigned threads = H >= 256 ? 256 : 32 * static_cast<unsigned>((H + 31) / 32);
  if (dout.dtype() == DType::BF16)
    launch_kernel(embedding_backward_kernel<bf16>, static_cast<unsigned>(N), threads, 0, stream,
        keys_sorted.data_as<uint32_t>(), vals_sorted.data_as<int32_t>(), dout.data_as<bf16>(), dtable.data_as<float>(),
        N, H, V);
  else
    launch_kernel(embedding_backward_kernel<float>, static_cast<unsigned>(N), threads, 0, stream,
        keys_sorted.data_as<uint32_t>(), vals_sorted.data_as<int32_t>(), dout.data_as<float>(),
        dtable.data_as<float>(), N, H, V);
}

}  // namespace mt::cuda
