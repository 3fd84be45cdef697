#include "kernels/cuda/grad_norm.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

struct NormLaunch {
  MultiTensorTable table;
  const void* g[kMultiTensorMax];
  bool bf16[kMultiTensorMax];
  int64_t partial_base;  // where this launch's blocks write in `partial`
  int64_t index[kMultiTensorMax];  // each launch tensor's position in the gradient list
};

// partial[block] = Σ g² over the block's chunk, fp32, reduced in a fixed order.
__global__ void sumsq_chunks_kernel(NormLaunch L, float* partial) {
  pdl_wait();
  __shared__ float scratch[32];
  const int64_t b = blockIdx.x;
  const int i = table_tensor(L.table, b);
  const int64_t begin = (b - L.table.chunk_begin[i]) * kChunkElems;
  const int64_t end = min(L.table.numel[i], begin + kChunkElems);
  float s = 0.0f;
  // 16-byte loads, four in flight per thread, over the aligned part of the chunk (chunks start on a
  // multiple of 65536 elements); the scalar loop takes the rest.
  constexpr int kUnroll = 4;
  int64_t tail = begin;
  if ((reinterpret_cast<uintptr_t>(L.g[i]) & 15u) == 0) {
    const int per = L.bf16[i] ? 8 : 4;  // elements per packet
    const int64_t packets = (end - begin) / per;
    const int64_t full = packets / (kUnroll * blockDim.x) * (kUnroll * blockDim.x);
    const uint4* base = reinterpret_cast<const uint4*>(static_cast<const char*>(L.g[i]) +
                                                       begin * (L.bf16[i] ? 2 : 4));
    for (int64_t q = threadIdx.x; q < full; q += kUnroll * blockDim.x) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[u] = base[q + u * blockDim.x];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (L.bf16[i]) {
          float f[8];
          bf16x8_to_float(raw[u], f);
#pragma unroll
          for (int e = 0; e < 8; ++e) s += f[e] * f[e];
        } else {
          const float4 f = *reinterpret_cast<const float4*>(&raw[u]);
          s += f.x * f.x + f.y * f.y + f.z * f.z + f.w * f.w;
        }
      }
    }
    tail = begin + full * per;
  }
  if (L.bf16[i]) {
    const bf16* g = static_cast<const bf16*>(L.g[i]);
    for (int64_t k = tail + threadIdx.x; k < end; k += blockDim.x) {
      const float v = __bfloat162float(g[k]);
      s += v * v;
    }
  } else {
    const float* g = static_cast<const float*>(L.g[i]);
    for (int64_t k = tail + threadIdx.x; k < end; k += blockDim.x) s += g[k] * g[k];
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[L.partial_base + b] = s;
}

// Block i: Σ g² of launch tensor i (double sums of its chunk partials, fixed order).
__global__ void tensor_sumsq_kernel(NormLaunch L, const float* __restrict__ partial, double* tensor_sumsq) {
  pdl_wait();
  __shared__ double sq[256];
  const int i = blockIdx.x;
  double s = 0.0;
  for (int64_t k = L.table.chunk_begin[i] + threadIdx.x; k < L.table.chunk_begin[i + 1]; k += blockDim.x)
    s += partial[L.partial_base + k];
  sq[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int k = 0; k < static_cast<int>(blockDim.x); ++k) t += sq[k];
    tensor_sumsq[L.index[i]] = t;
  }
}

// One block: each tensor's norm fp32(sqrt(Σ g²)), total = sqrt(Σ_t norm_t²) in double, and the clipping
// coefficient.
__global__ void norm_finish_kernel(const double* __restrict__ tensor_sumsq, int64_t tensors, float max_norm,
                                   float* norm_out, float* coef_out) {
  pdl_wait();
  __shared__ double sq[256];
  double s = 0.0;
  for (int64_t t = threadIdx.x; t < tensors; t += blockDim.x) {
    const double n = static_cast<float>(sqrt(tensor_sumsq[t]));
    s += n * n;
  }
  sq[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int k = 0; k < static_cast<int>(blockDim.x); ++k) total += sq[k];
    const double norm = sqrt(total);
    *norm_out = static_cast<float>(norm);
    *coef_out = max_norm > 0.0f ? static_cast<float>(fmin(1.0, max_norm / (norm + 1e-6))) : 1.0f;
  }
}

}  // namespace

void grad_norm_clip_coef(const std::vector<const Tensor*>& grads, float max_norm, Tensor& norm, Tensor& coef,
                         cudaStream_t stream, const std::function<void(Tensor&)>& reduce_sumsq) {
  const char* op = "grad_norm_clip_coef";
  MT_CUDA_REQUIRE(norm.defined() && norm.device().is_cuda(), std::string(op) + ": norm must be a CUDA F32 [1]");
  const int dev = norm.device().index;
  check_tensor(norm, op, dev, DType::F32, 1);
  check_tensor(coef, op, dev, DType::F32, 1);
  int64_t total_chunks = 0;
  for (const Tensor* g : grads) {
    MT_CUDA_REQUIRE(g != nullptr, std::string(op) + ": null gradient");
    check_float_dtype(*g, op);
    MT_CUDA_REQUIRE(g->device() == norm.device(),
                    std::string(op) + ": gradient " + tensor_where(*g) + " not on " + norm.device().str());
    total_chunks += chunks_of(g->numel());
  }
  const int64_t tensors = static_cast<int64_t>(grads.size());
  const Device d = Device::cuda(dev);
  Tensor partial = Tensor::empty({std::max<int64_t>(total_chunks, 1)}, DType::F32, d);
  Tensor tensor_sumsq = Tensor::empty({std::max<int64_t>(tensors, 1)}, DType::F64, d);
  MT_CUDA_CHECK(cudaMemsetAsync(tensor_sumsq.data(), 0, tensor_sumsq.nbytes(), stream));  // empty tensors: 0
  NormLaunch L{};
  auto flush = [&]() {
    if (L.table.count == 0) return;
    const int64_t blocks = table_finish(L.table);
    launch_kernel(sumsq_chunks_kernel, static_cast<unsigned>(blocks), kMultiTensorThreads, 0, stream, L,
        partial.data_as<float>());
    launch_kernel(tensor_sumsq_kernel, L.table.count, 256, 0, stream, L, partial.data_as<float>(),
        tensor_sumsq.data_as<double>());
    L.partial_base += blocks;
    L.table.count = 0;
  };
  for (size_t gi = 0; gi < grads.size(); ++gi) {
    const Tensor* g = grads[gi];
    if (g->numel() == 0) continue;  // a zero norm: contributes nothing
    L.index[L.table.count] = static_cast<int64_t>(gi);
    L.g[L.table.count] = g->data();
    L.bf16[L.table.count] = g->dtype() == DType::BF16;
    L.table.numel[L.table.count] = g->numel();
    if (++L.table.count == kMultiTensorMax) flush();
  }
  flush();
  if (reduce_sumsq) reduce_sumsq(tensor_sumsq);
  launch_kernel(norm_finish_kernel, 1, 256, 0, stream, tensor_sumsq.data_as<double>(), tensors, max_norm,
      norm.data_as<float>(), coef.data_as<float>());
}

}  // namespace mt::cuda
