#include "kernels/cuda/rmsnorm.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

// One warp per row. With `res`, the row is first replaced by x + res (rounded to T) and written to `sum`.
template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* res, const T* __restrict__ w,
                                       T* sum, T* out, float* rstd_out, int64_t rows, int64_t n, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * n;
  float ss = 0.0f;
  if (res) {
    const T* rr = res + row * n;
    T* sr = sum + row * n;
    for (int64_t i = lane; i < n; i += 32) {
      const float h = Elt<T>::round(Elt<T>::load(xr, i) + Elt<T>::load(rr, i));
      Elt<T>::store(sr, i, h);
      ss += h * h;
    }
    xr = sr;  // the same lane reads back exactly the elements it wrote
  } else {
    for (int64_t i = lane; i < n; i += 32) {
      const float v = Elt<T>::load(xr, i);
      ss += v * v;
    }
  }
  ss = warp_sum(ss);
  const float rstd = rsqrtf(ss / static_cast<float>(n) + eps);
  if (rstd_out && lane == 0) rstd_out[row] = rstd;
  T* orow = out + row * n;
  for (int64_t i = lane; i < n; i += 32) {
    const float y = Elt<T>::load(xr, i) * rstd;
    Elt<T>::store(orow, i, Elt<T>::load(w, i) * Elt<T>::round(y));
  }
}

// Backward pass 1, one warp per row: rstd and m = mean((dy ⊙ w) ⊙ y), y = x·rstd.
template <typename T>
__global__ void rmsnorm_row_stats_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                         float* rstd_out, float* m_out, int64_t rows, int64_t n, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * n;
  const T* gr = dy + row * n;
  float ss = 0.0f, dot = 0.0f;
  for (int64_t i = lane; i < n; i += 32) {
    const float v = Elt<T>::load(xr, i);
    ss += v * v;
    dot += Elt<T>::load(gr, i) * Elt<T>::load(w, i) * v;
  }
  ss = warp_sum(ss);
  dot = warp_sum(dot);
  const float rstd = rsqrtf(ss / static_cast<float>(n) + eps);
  if (lane == 0) {
    rstd_out[row] = rstd;
    m_out[row] = dot * rstd / static_cast<float>(n);
  }
}

// Backward pass 2: partial[chunk, c] = Σ_{rows of chunk} dy[r, c]·x[r, c]·rstd[r] (coalesced over c).
template <typename T>
__global__ void rmsnorm_dw_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          const float* __restrict__ rstd, float* partial, int64_t rows, int64_t n,
                                          int64_t chunk_rows) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = min(rows, r0 + chunk_rows);
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += Elt<T>::load(dy, r * n + c) * (Elt<T>::load(x, r * n + c) * rstd[r]);
  partial[blockIdx.y * n + c] = s;
}

// Backward pass 3: dw[c] += Σ_chunks partial[chunk, c], chunks in order.
__global__ void rmsnorm_dw_reduce_kernel(const float* __restrict__ partial, float* dw, int64_t chunks, int64_t n) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * n + c];
  dw[c] += s;
}

// Backward pass 4 (elementwise): dx = rstd·(dy·w − x·rstd·m) (+ dres).
template <typename T>
__global__ void rmsnorm_dx_kernel(const T* dy, const T* __restrict__ x, const T* __restrict__ w,
                                  const float* __restrict__ rstd, const float* __restrict__ m, const T* dres, T* dx,
                                  int64_t rows, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  const int64_t r = i / n, c = i - r * n;
  const float rs = rstd[r];
  float v = rs * (Elt<T>::load(dy, i) * Elt<T>::load(w, c) - Elt<T>::load(x, i) * rs * m[r]);
  if (dres) v += Elt<T>::load(dres, i);
  Elt<T>::store(dx, i, v);
}

struct Rows {
  int device;
  int64_t rows, n;
};

Rows check_norm_io(const Tensor& x, const Tensor& w, const char* op) {
  check_float_dtype(x, op);
  MT_CUDA_REQUIRE(w.ndim() == 1 && x.ndim() >= 1 && x.dim(-1) == w.dim(0),
                  std::string(op) + ": input " + tensor_where(x) + " does not match weight " + tensor_where(w));
  const int dev = x.device().index;
  const int64_t n = w.dim(0);
  check_tensor(w, op, dev, x.dtype(), n);
  return {dev, n == 0 ? 0 : x.numel() / n, n};
}

template <typename T>
void launch_forward(const Tensor& x, const Tensor* res, const Tensor& w, float eps, Tensor* sum, Tensor& out,
                    Tensor* rstd, const Rows& r, cudaStream_t stream) {
  if (r.rows == 0 || r.n == 0) return;
  rmsnorm_forward_kernel<T><<<blocks_for(r.rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      x.data_as<T>(), res ? res->data_as<T>() : nullptr, w.data_as<T>(), sum ? sum->data_as<T>() : nullptr,
      out.data_as<T>(), rstd ? rstd->data_as<float>() : nullptr, r.rows, r.n, eps);
  MT_CUDA_CHECK_LAUNCH();
}

void forward_any(const Tensor& x, const Tensor* res, const Tensor& w, float eps, Tensor* sum, Tensor& out,
                 Tensor* rstd, cudaStream_t stream, const char* op) {
  const Rows r = check_norm_io(x, w, op);
  check_tensor(out, op, r.device, x.dtype(), x.numel());
  if (res) check_tensor(*res, op, r.device, x.dtype(), x.numel());
  if (sum) check_tensor(*sum, op, r.device, x.dtype(), x.numel());
  if (rstd) check_tensor(*rstd, op, r.device, DType::F32, r.rows);
  if (x.dtype() == DType::BF16)
    launch_forward<bf16>(x, res, w, eps, sum, out, rstd, r, stream);
  else
    launch_forward<float>(x, res, w, eps, sum, out, rstd, r, stream);
}

template <typename T>
void launch_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, Tensor& dx, Tensor& dw,
                     const Tensor* dres, const Rows& r, cudaStream_t stream) {
  if (r.rows == 0 || r.n == 0) return;
  const Device d = Device::cuda(r.device);
  Tensor rstd = Tensor::empty({r.rows}, DType::F32, d);
  Tensor m = Tensor::empty({r.rows}, DType::F32, d);
  rmsnorm_row_stats_kernel<T><<<blocks_for(r.rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      dy.data_as<T>(), x.data_as<T>(), w.data_as<T>(), rstd.data_as<float>(), m.data_as<float>(), r.rows, r.n, eps);
  MT_CUDA_CHECK_LAUNCH();
  // Fixed chunking (depends only on the shape): at most ~1024 partial rows per column.
  const int64_t chunk_rows = std::max<int64_t>(32, (r.rows + 1023) / 1024);
  const int64_t chunks = (r.rows + chunk_rows - 1) / chunk_rows;
  Tensor partial = Tensor::empty({chunks, r.n}, DType::F32, d);
  dim3 grid(blocks_for(r.n, 256), static_cast<unsigned>(chunks));
  rmsnorm_dw_partial_kernel<T><<<grid, 256, 0, stream>>>(dy.data_as<T>(), x.data_as<T>(), rstd.data_as<float>(),
                                                          partial.data_as<float>(), r.rows, r.n, chunk_rows);
  MT_CUDA_CHECK_LAUNCH();
  rmsnorm_dw_reduce_kernel<<<blocks_for(r.n, 256), 256, 0, stream>>>(partial.data_as<float>(), dw.data_as<float>(),
                                                                     chunks, r.n);
  MT_CUDA_CHECK_LAUNCH();
  // dx last: it may overwrite dy, which the dw passes read.
  rmsnorm_dx_kernel<T><<<blocks_for(r.rows * r.n, 256), 256, 0, stream>>>(
      dy.data_as<T>(), x.data_as<T>(), w.data_as<T>(), rstd.data_as<float>(), m.data_as<float>(),
      dres ? dres->data_as<T>() : nullptr, dx.data_as<T>(), r.rows, r.n);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& out, Tensor* rstd, cudaStream_t stream) {
  forward_any(x, nullptr, w, eps, nullptr, out, rstd, stream, "rmsnorm_forward");
}

void rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& w, float eps, Tensor& sum,
                              Tensor& out, Tensor* rstd, cudaStream_t stream) {
  forward_any(x, &residual, w, eps, &sum, out, rstd, stream, "rmsnorm_residual_forward");
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, Tensor& dx, Tensor& dw,
                      const Tensor* dresidual, cudaStream_t stream) {
  const char* op = "rmsnorm_backward";
  const Rows r = check_norm_io(x, w, op);
  check_tensor(dy, op, r.device, x.dtype(), x.numel());
  check_tensor(dx, op, r.device, x.dtype(), x.numel());
  check_tensor(dw, op, r.device, DType::F32, r.n);
  if (dresidual) check_tensor(*dresidual, op, r.device, x.dtype(), x.numel());
  if (x.dtype() == DType::BF16)
    launch_backward<bf16>(dy, x, w, eps, dx, dw, dresidual, r, stream);
  else
    launch_backward<float>(dy, x, w, eps, dx, dw, dresidual, r, stream);
}

}  // namespace mt::cuda
