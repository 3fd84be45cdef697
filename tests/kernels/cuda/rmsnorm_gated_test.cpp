// CUDA gated RMSNorm (kernels/cuda/rmsnorm_gated.h) against cpu::rmsnorm_gated_* (plus the CPU block's bf16 rounding
// of the output in BF16), with the gate z read from columns of a wider proj and dz written into columns of a wider
// dproj whose other columns must stay untouched; groups of n/8 (Nemotron's), n (one group) and odd sizes.
//
// Tolerances (max-norm = max|Δ| / max|ref|, rel-L2):
// - out: the CPU sums t² in double, the device in fp32 (a warp's strided sums and a shuffle tree over ≤ 4096 terms:
//   ≲ 1e-6 relative), silu's expf differs by a few ulps. F32: 5e-6 / 2e-6. BF16: that can flip the one bf16 rounding
//   of an element (rarely; one bf16 step, ≤ 2^-7 of it at the bottom of a binade): 8e-3 / 1e-3.
// - dy (F32 on both sides), and dz in F32: m = mean(du ⊙ u) in double vs fp32 (≲ 1e-6 relative), rstd as above;
//   dt = rstd·(du − u·m) can cancel a little: 2e-5 / 5e-6. dz in BF16: rounded once on the device (half a step: ≤
//   2^-8 = 3.9e-3 of the element, ~1.6e-3 rms): 4e-3 / 3e-3 (dy stays F32: 2e-5 / 5e-6, the inputs being the same
//   bf16 values).
// - dw: the CPU sums over rows in double, the device in fp32 (rows in order per block, ≤ 512 parts, 32 strides):
//   5e-5 / 1e-5.
// Bit-reproducibility: dw from two runs compared bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "kernels/cpu/rmsnorm_gated.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/rmsnorm_gated.h"
#include "mamba2_test_util.h"

namespace mt {
namespace {

struct GatedCase {
  int64_t T = 0, n = 0, group = 0, W = 0, zcol0 = 0, dW = 0, dzcol0 = 0;
  DType dt = DType::BF16, param_dt = DType::BF16;
  bool frozen = false;
  float eps = 1e-5f;
  uint64_t seed = 1;
};

void run_case(const GatedCase& c) {
  const bool bf = c.dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + " T=" + std::to_string(c.T) + " n=" +
                           std::to_string(c.n) + " group=" + std::to_string(c.group) + " zcol0=" +
                           std::to_string(c.zcol0) + (c.frozen ? " frozen" : "");
  auto& ctx = cuda::device_context(0);
  const int64_t T = c.T, n = c.n;
  const Tensor y = test::host_random({T, n}, c.seed, 1.0f);
  const Tensor proj = test::host_random({T, c.W}, c.seed + 1, 1.5f, bf);
  std::vector<float> wv = test::host_random({n}, c.seed + 2, 0.2f, true).to_floats();
  for (float& v : wv) v = round_bf16(1.0f + v);
  const Tensor w = Tensor::from_floats({n}, wv).to(c.param_dt);
  const Tensor dout = test::host_random({T, n}, c.seed + 3, 1.0f, bf);
  const Tensor dw0 = test::host_random({n}, c.seed + 4, 0.1f);
  const Tensor dproj0 = test::host_random({T, c.dW}, c.seed + 5, 1.0f, bf);

  // CPU.
  const Tensor z = test::host_columns(proj.to_floats(), T, c.W, c.zcol0, n);
  std::vector<float> out_ref = cpu::rmsnorm_gated_forward(y, z, w, c.group, c.eps).to_floats();
  if (bf)
    for (float& v : out_ref) v = round_bf16(v);
  Tensor dy_ref, dz_ref, dw_ref = c.frozen ? Tensor() : dw0.clone();
  cpu::rmsnorm_gated_backward(dout, y, z, w, c.group, c.eps, dy_ref, dz_ref, dw_ref);

  // Device.
  const Tensor y_dev = cuda::to_device(y, 0), proj_dev = test::device_from_host(proj, c.dt);
  const Tensor w_dev = cuda::to_device(w, 0);
  Tensor out = Tensor::empty({T, n}, c.dt, Device::cuda(0));
  cuda::rmsnorm_gated_forward(y_dev, proj_dev, c.zcol0, w_dev, c.group, c.eps, out, ctx.stream);
  test::expect_near_normalised(test::device_floats(out), out_ref, bf ? 8e-3 : 5e-6, bf ? 1e-3 : 2e-6, what + " out");

  const Tensor dout_dev = test::device_from_host(dout, c.dt);
  std::vector<float> dw_runs[2], dy_out, dproj_out;
  for (int run = 0; run < 2; ++run) {
    Tensor dy = Tensor::empty({T, n}, DType::F32, Device::cuda(0));
    Tensor dproj = test::device_from_host(dproj0, c.dt);
    Tensor dw = c.frozen ? Tensor() : cuda::to_device(dw0, 0);
    cuda::rmsnorm_gated_backward(dout_dev, y_dev, proj_dev, c.zcol0, w_dev, c.group, c.eps, dy, dproj, c.dzcol0, dw,
                                 ctx.stream);
    if (!c.frozen) dw_runs[run] = test::device_floats(dw);
    if (run == 0) dy_out = test::device_floats(dy), dproj_out = test::device_floats(dproj);
  }
  test::expect_near_normalised(dy_out, dy_ref.to_floats(), 2e-5, 5e-6, what + " dy");
  test::expect_near_normalised(test::columns_of(dproj_out, T, c.dW, c.dzcol0, n), dz_ref.to_floats(),
                               bf ? 4e-3 : 2e-5, bf ? 3e-3 : 5e-6, what + " dz");
  test::expect_other_columns_untouched(dproj_out, dproj0.to_floats(), T, c.dW, c.dzcol0, n, what + " dproj");
  if (!c.frozen) {
    test::expect_near_normalised(dw_runs[0], dw_ref.to_floats(), 5e-5, 1e-5, what + " dw");
    test::expect_bitwise_equal(dw_runs[0], dw_runs[1], what + " dw run to run");
  }
}

TEST(CudaRmsnormGated, MatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 6100;
  for (DType dt : {DType::BF16, DType::F32}) {
    GatedCase c;
    c.dt = dt, c.param_dt = dt;
    c.T = 7, c.n = 12, c.group = 12, c.W = 21, c.zcol0 = 3, c.dW = 15, c.dzcol0 = 1;  // one group, scalar path
    c.seed = seed += 10;
    run_case(c);
    c.T = 66, c.n = 64, c.group = 16, c.W = 96, c.zcol0 = 32, c.dW = 72, c.dzcol0 = 8;  // vector path, 4 groups
    c.seed = seed += 10;
    run_case(c);
    c.T = 600, c.n = 96, c.group = 32, c.W = 100, c.zcol0 = 0, c.dW = 96, c.dzcol0 = 0;  // 2 rows per block
    c.param_dt = DType::F32, c.seed = seed += 10;
    run_case(c);
    c.T = 20, c.n = 1024, c.group = 1024, c.W = 1030, c.zcol0 = 6, c.dW = 1024, c.dzcol0 = 0;  // one wide group
    c.frozen = true, c.seed = seed += 10;
    run_case(c);
    c.T = 9, c.n = 30, c.group = 3, c.W = 30, c.zcol0 = 0, c.dW = 31, c.dzcol0 = 1;  // 10 groups of 3 (> 8 warps)
    c.frozen = false, c.seed = seed += 10;
    run_case(c);
  }
}

// Nemotron 3 Nano: n = 4096 in 8 groups of 512, z at columns [0, 4096) of in_proj's 10304 (the backward's shared
// memory, 3n + 2G floats, is above the default 48 KiB).
TEST(CudaRmsnormGated, NemotronNanoShape) {
  MT_SKIP_WITHOUT_CUDA();
  GatedCase c;
  c.T = 1100, c.n = 4096, c.group = 512, c.W = 10304, c.zcol0 = 0, c.dW = 10304, c.dzcol0 = 0;
  c.seed = 6300;
  run_case(c);
}

TEST(CudaRmsnormGated, ZeroTokensAndBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  const Tensor w = Tensor::empty({8}, DType::BF16, d);
  Tensor y0 = Tensor::empty({0, 8}, DType::F32, d), proj0 = Tensor::empty({0, 12}, DType::BF16, d);
  Tensor out0 = Tensor::empty({0, 8}, DType::BF16, d), dw = Tensor::empty({8}, DType::F32, d);
  cuda::rmsnorm_gated_forward(y0, proj0, 4, w, 4, 1e-5f, out0, ctx.stream);
  cuda::rmsnorm_gated_backward(out0, y0, proj0, 4, w, 4, 1e-5f, y0, proj0, 0, dw, ctx.stream);
  Tensor y = Tensor::empty({2, 8}, DType::F32, d), proj = Tensor::empty({2, 12}, DType::BF16, d);
  Tensor out = Tensor::empty({2, 8}, DType::BF16, d);
  EXPECT_THROW(cuda::rmsnorm_gated_forward(y, proj, 5, w, 4, 1e-5f, out, ctx.stream), Error);  // past W
  EXPECT_THROW(cuda::rmsnorm_gated_forward(y, proj, 0, w, 3, 1e-5f, out, ctx.stream), Error);  // 8 % 3 != 0
  Tensor out_f32 = Tensor::empty({2, 8}, DType::F32, d);
  EXPECT_THROW(cuda::rmsnorm_gated_forward(y, proj, 0, w, 4, 1e-5f, out_f32, ctx.stream), Error);
  Tensor dproj_narrow = Tensor::empty({2, 8}, DType::BF16, d);
  EXPECT_THROW(cuda::rmsnorm_gated_backward(out, y, proj, 0, w, 4, 1e-5f, y, dproj_narrow, 1, dw, ctx.stream), Error);
}

}  // namespace
}  // namespace mt
