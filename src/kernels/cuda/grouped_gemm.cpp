#include "kernels/cuda/grouped_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/device_tensor_check.h"
#include "kernels/cuda/grouped_gemm_kernels.h"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

std::atomic<detail::GroupedFwdKernel> g_fwd_kernel{detail::GroupedFwdKernel::Auto};

// The Hopper forward, dgrad and wgrad are the default on cc 9.x (H200 forward: 477 / 387 TFLOP/s for gate_up / down
// vs 260 / 237 with mma.sync, bit-identical outputs); MIXTUNE_GROUPED_GEMM=mma selects the mma.sync kernels.
bool wgmma_requested() {
  static const bool on = env_allows_sm90("MIXTUNE_GROUPED_GEMM");
  return on;
}

// Whether forward / dgrad run the Hopper kernel (grouped_gemm_fwd_kernel_get, then the environment).
bool use_wgmma(const char* op, const DeviceContext& ctx, int64_t rows) {
  const detail::GroupedFwdKernel kind = detail::grouped_gemm_fwd_kernel_get();
  const bool tma_shape = rows < (int64_t{1} << 31);  // TMA coordinates are int32
  if (kind == detail::GroupedFwdKernel::Wgmma) {
    MT_CHECK(ctx.cc_major == 9 && detail::grouped_gemm_sm90_compiled(),
             "{}: the wgmma kernel needs a cc 9.0 GPU and an sm_90a build (device {} is cc {}.{})", op, ctx.device,
             ctx.cc_major, ctx.cc_minor);
    MT_CHECK(tma_shape, "{}: the wgmma kernel takes fewer than 2^31 rows, found {}", op, rows);
    return true;
  }
  return kind == detail::GroupedFwdKernel::Auto && wgmma_requested() && ctx.cc_major == 9 && tma_shape &&
         detail::grouped_gemm_sm90_compiled();
}

// A claimed-tile kernel's counter (the wgrad's always, the forward/dgrad's with grouped_gemm_sm90_dynamic): a
// zeroed device int from the caching allocator (released in stream order after the launch, so concurrent
// launches never share one).
Tensor tile_counter(Device device, cudaStream_t stream) {
  Tensor counter = Tensor::empty({1}, DType::I32, device);
  fill_zero_async(counter, stream);
  return counter;
}

void check_common(const char* op, const Tensor& offsets, int64_t E, int64_t nout, int64_t k,
                  std::initializer_list<const Tensor*> data) {
  check_device_tensor(offsets, "grouped gemm offsets", DType::I32, {E + 1});
  MT_CHECK(E >= 1 && E <= 4096, "{}: {} experts", op, E);
  MT_CHECK(nout % 8 == 0 && k % 8 == 0 && nout > 0 && k > 0 && nout < (int64_t{1} << 30) && k < (int64_t{1} << 30),
           "{}: dimensions {} x {} must be positive multiples of 8", op, nout, k);
  for (const Tensor* t : data) {
    MT_CHECK(aligned16(*t), "{}: {} is not 16-byte aligned", op, t->desc());
    check_same_device(*t, offsets, op);
  }
}

}  // namespace

void grouped_gemm_forward(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y, cudaStream_t stream) {
  MT_CHECK(x.defined() && w.defined() && x.ndim() == 2 && w.ndim() == 3,
           "grouped gemm forward: x [N, K], w [E, Nout, K]");
  const int64_t N = x.dim(0), K = x.dim(1), E = w.dim(0), Nout = w.dim(1);
  check_device_tensor(x, "grouped gemm x", DType::BF16, {N, K});
  check_device_tensor(w, "grouped gemm w", DType::BF16, {E, Nout, K});
  check_device_tensor(y, "grouped gemm y", DType::BF16, {N, Nout});
  check_common("grouped gemm forward", offsets, E, Nout, K, {&x, &w, &y});
  DeviceContext& ctx = device_context(x.device().index);
  if (use_wgmma("grouped gemm forward", ctx, N)) {
    Tensor counter = detail::grouped_gemm_sm90_dynamic() ? tile_counter(x.device(), stream) : Tensor();
    detail::grouped_gemm_fwd_sm90_launch(x.data(), w.data(), y.data(), offsets.data_as<int32_t>(), static_cast<int>(E),
                                         N, static_cast<int>(Nout), static_cast<int>(K), ctx.sm_count,
                                         counter.defined() ? counter.data_as<int32_t>() : nullptr, stream);
  } else
    detail::grouped_gemm_fwd_launch(x.data(), w.data(), y.data(), offsets.data_as<int32_t>(), static_cast<int>(E), N,
                                    static_cast<int>(Nout), static_cast<int>(K), ctx.sm_count, stream);
}

void grouped_gemm_dgrad(const Tensor& dy, const Tensor& w, const Tensor& offsets, Tensor& dx, cudaStream_t stream) {
  MT_CHECK(dy.defined() && w.defined() && dy.ndim() == 2 && w.ndim() == 3,
           "grouped gemm dgrad: dy [N, Nout], w [E, Nout, K]");
  const int64_t N = dy.dim(0), Nout = dy.dim(1), E = w.dim(0), K = w.dim(2);
  check_device_tensor(dy, "grouped gemm dy", DType::BF16, {N, Nout});
  check_device_tensor(w, "grouped gemm w", DType::BF16, {E, Nout, K});
  check_device_tensor(dx, "grouped gemm dx", DType::BF16, {N, K});
  check_common("grouped gemm dgrad", offsets, E, Nout, K, {&dy, &w, &dx});
  DeviceContext& ctx = device_context(dy.device().index);
  if (use_wgmma("grouped gemm dgrad", ctx, N)) {
    Tensor counter = detail::grouped_gemm_sm90_dynamic() ? tile_counter(dy.device(), stream) : Tensor();
    detail::grouped_gemm_dgrad_sm90_launch(dy.data(), w.data(), dx.data(), offsets.data_as<int32_t>(),
                                           static_cast<int>(E), N, static_cast<int>(Nout), static_cast<int>(K),
                                           ctx.sm_count, counter.defined() ? counter.data_as<int32_t>() : nullptr,
                                           stream);
  } else
    detail::grouped_gemm_dgrad_launch(dy.data(), w.data(), dx.data(), offsets.data_as<int32_t>(), static_cast<int>(E),
                                      N, static_cast<int>(Nout), static_cast<int>(K), ctx.sm_count, stream);
}

void grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, Tensor& dw, bool accumulate,
                        cudaStream_t stream) {
  MT_CHECK(dy.defined() && x.defined() && dw.defined() && dy.ndim() == 2 && x.ndim() == 2 && dw.ndim() == 3,
           "grouped gemm wgrad: dy [N, Nout], x [N, K], dw [E, Nout, K]");
  const int64_t N = dy.dim(0), Nout = dy.dim(1), K = x.dim(1), E = dw.dim(0);
  check_device_tensor(dy, "grouped gemm dy", DType::BF16, {N, Nout});
  check_device_tensor(x, "grouped gemm x", DType::BF16, {N, K});
  check_device_tensor2(dw, "grouped gemm dw", DType::F32, DType::BF16, {E, Nout, K});
  check_common("grouped gemm wgrad", offsets, E, Nout, K, {&dy, &x, &dw});
  DeviceContext& ctx = device_context(dy.device().index);
  if (use_wgmma("grouped gemm wgrad", ctx, N)) {
    Tensor counter = tile_counter(dy.device(), stream);
    detail::grouped_gemm_wgrad_sm90_launch(dy.data(), x.data(), N, dw.data(), dw.dtype() == DType::BF16,
                                           offsets.data_as<int32_t>(), static_cast<int>(E), static_cast<int>(Nout),
                                           static_cast<int>(K), accumulate, ctx.sm_count,
                                           counter.data_as<int32_t>(), stream);
  } else
    detail::grouped_gemm_wgrad_launch(dy.data(), x.data(), dw.data(), dw.dtype() == DType::BF16,
                                      offsets.data_as<int32_t>(), static_cast<int>(E), static_cast<int>(Nout),
                                      static_cast<int>(K), accumulate, ctx.sm_count, stream);
}

void grouped_gemm_wgrad2(const Tensor& dy1, const Tensor& x1, const Tensor& offsets1, const Tensor& dy2,
                         const Tensor& x2, const Tensor& offsets2, Tensor& dw, bool accumulate, cudaStream_t stream) {
  MT_CHECK(dy1.defined() && x1.defined() && dy2.defined() && x2.defined() && dw.defined() && dy1.ndim() == 2 &&
               x1.ndim() == 2 && dy2.ndim() == 2 && x2.ndim() == 2 && dw.ndim() == 3,
           "grouped gemm wgrad2: dy [N, Nout], x [N, K] twice, dw [E, Nout, K]");
  const int64_t N1 = dy1.dim(0), N2 = dy2.dim(0), Nout = dy1.dim(1), K = x1.dim(1), E = dw.dim(0);
  check_device_tensor(dy1, "grouped gemm dy1", DType::BF16, {N1, Nout});
  check_device_tensor(x1, "grouped gemm x1", DType::BF16, {N1, K});
  check_device_tensor(dy2, "grouped gemm dy2", DType::BF16, {N2, Nout});
  check_device_tensor(x2, "grouped gemm x2", DType::BF16, {N2, K});
  check_device_tensor2(dw, "grouped gemm dw", DType::F32, DType::BF16, {E, Nout, K});
  check_common("grouped gemm wgrad2", offsets1, E, Nout, K, {&dy1, &x1, &dw});
  check_common("grouped gemm wgrad2", offsets2, E, Nout, K, {&dy2, &x2, &dw});
  DeviceContext& ctx = device_context(dy1.device().index);
  if (use_wgmma("grouped gemm wgrad2", ctx, std::max(N1, N2))) {
    Tensor counter = tile_counter(dy1.device(), stream);
    detail::grouped_gemm_wgrad_sm90_launch(dy1.data(), x1.data(), N1, dw.data(), dw.dtype() == DType::BF16,
                                           offsets1.data_as<int32_t>(), static_cast<int>(E), static_cast<int>(Nout),
                                           static_cast<int>(K), accumulate, ctx.sm_count,
                                           counter.data_as<int32_t>(), stream, dy2.data(),
                                           x2.data(), N2, offsets2.data_as<int32_t>());
    return;
  }
  detail::grouped_gemm_wgrad_launch(dy1.data(), x1.data(), dw.data(), dw.dtype() == DType::BF16,
                                    offsets1.data_as<int32_t>(), static_cast<int>(E), static_cast<int>(Nout),
                                    static_cast<int>(K), accumulate, ctx.sm_count, stream, dy2.data(), x2.data(),
                                    offsets2.data_as<int32_t>());
}

namespace detail {

void grouped_gemm_fwd_kernel_set(GroupedFwdKernel k) { g_fwd_kernel.store(k); }
GroupedFwdKernel grouped_gemm_fwd_kernel_get() { return g_fwd_kernel.load(); }

}  // namespace detail

}  // namespace mt::cuda
