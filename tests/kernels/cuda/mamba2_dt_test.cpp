// CUDA Mamba2 time step and A (kernels/cuda/mamba2_dt.h) against the CPU block's loops (layers/mamba2_mixer_block.cpp,
// copied here as the reference: dt = max(softplus(proj + dt_bias), time_step_min) with the bf16 roundings, its
// backward through the clamp and softplus, cpu::bias_backward for dt_bias, A = −exp(A_log), dA_log = dA ⊙ A). dt's
// input is read from columns of a wider proj, its gradient written into columns of a wider dproj whose other columns
// must stay untouched. Inputs cover softplus's pass-through (> 20) and the clamp (softplus below time_step_min).
//
// Tolerances (max-norm = max|Δ| / max|ref|, rel-L2):
// - dt: the add is the same fp32 op (and bf16 rounding); log1pf/expf vs glibc differ by a few fp32 ulps. F32: 2e-6 /
//   1e-6. BF16: that can flip the softplus's bf16 rounding (rarely; one bf16 step, ≤ 2^-7 of the element at the
//   bottom of a binade): 8e-3 / 1e-3.
// - dproj's dt columns: sigmoid via expf (few ulps). F32: 2e-6 / 1e-6. BF16: rounded once on the device (half a
//   step: ≤ 2^-8 = 3.9e-3 of the element, ~1.6e-3 rms): 4e-3 / 3e-3.
// - ddt_bias: fp32 sums in both (the CPU in row order, the device in 8 row strides, ≤ 128 parts, 32 strides): ≲ 1e-6
//   of the scale for ≤ a few thousand rows: 2e-5 / 1e-5.
// - A, dA_log: expf vs exp, then one multiply: 2e-6 / 1e-6.
// Bit-reproducibility: ddt_bias from two runs compared bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/mamba2_dt.h"
#include "mamba2_test_util.h"

namespace mt {
namespace {

float softplus_ref(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

struct DtCase {
  int64_t T = 0, heads = 0, W = 0, col0 = 0, dW = 0, dcol0 = 0;
  DType dt = DType::BF16, param_dt = DType::BF16;
  bool frozen = false;
  double tmin = 1e-3;
  uint64_t seed = 1;
};

void run_case(const DtCase& c) {
  const bool bf = c.dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + " T=" + std::to_string(c.T) + " heads=" +
                           std::to_string(c.heads) + " col0=" + std::to_string(c.col0) + (c.frozen ? " frozen" : "");
  auto& ctx = cuda::device_context(0);
  const int64_t T = c.T, nh = c.heads;
  // proj: dt columns spread over [−12, 26] (the clamp below ~−6.9, the pass-through above 20), others N(0, 1).
  std::vector<float> projv = test::host_random({T, c.W}, c.seed, 1.0f).to_floats();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const float u = static_cast<float>((t * 131 + h * 71 + static_cast<int64_t>(c.seed)) % 389) / 388.0f;
      projv[t * c.W + c.col0 + h] = -12.0f + 38.0f * u;
    }
  if (bf)
    for (float& v : projv) v = round_bf16(v);
  const Tensor proj = Tensor::from_floats({T, c.W}, projv);
  const Tensor bias = test::host_random({nh}, c.seed + 1, 0.5f, true).to(c.param_dt);
  const Tensor ddt = test::host_random({T, nh}, c.seed + 2, 1.0f);
  const Tensor dbias0 = test::host_random({nh}, c.seed + 3, 0.1f);
  const Tensor dproj0 = test::host_random({T, c.dW}, c.seed + 4, 1.0f, bf);

  // CPU: the block's loops.
  const std::vector<float> bv = cpu::param_f32(bias).to_floats(), ddtv = ddt.to_floats();
  const float tmin = bf ? round_bf16(static_cast<float>(c.tmin)) : static_cast<float>(c.tmin);
  std::vector<float> dt_ref(static_cast<size_t>(T * nh)), g_ref(static_cast<size_t>(T * nh));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t i = t * nh + h;
      float r = projv[t * c.W + c.col0 + h] + bv[h];
      if (bf) r = round_bf16(r);
      float v = softplus_ref(r);
      if (bf) v = round_bf16(v);
      dt_ref[i] = v >= tmin ? v : tmin;
      const float through = v >= tmin ? ddtv[i] : 0.0f;
      g_ref[i] = r > 20.0f ? through : through / (1.0f + std::exp(-r));
    }
  Tensor dbias_ref = dbias0.clone();
  if (!c.frozen) cpu::bias_backward(Tensor::from_floats({T, nh}, g_ref), dbias_ref);

  const Tensor proj_dev = test::device_from_host(proj, c.dt);
  const Tensor bias_dev = cuda::to_device(bias, 0);
  Tensor dt = Tensor::empty({T, nh}, DType::F32, Device::cuda(0));
  cuda::mamba2_dt_forward(proj_dev, c.col0, bias_dev, c.tmin, dt, ctx.stream);
  test::expect_near_normalised(test::device_floats(dt), dt_ref, bf ? 8e-3 : 2e-6, bf ? 1e-3 : 1e-6, what + " dt");

  const Tensor ddt_dev = cuda::to_device(ddt, 0);
  std::vector<float> dbias_runs[2], dproj_out;
  for (int run = 0; run < 2; ++run) {
    Tensor dproj = test::device_from_host(dproj0, c.dt);
    Tensor dbias = c.frozen ? Tensor() : cuda::to_device(dbias0, 0);
    cuda::mamba2_dt_backward(ddt_dev, proj_dev, c.col0, bias_dev, c.tmin, dproj, c.dcol0, dbias, ctx.stream);
    if (!c.frozen) dbias_runs[run] = test::device_floats(dbias);
    if (run == 0) dproj_out = test::device_floats(dproj);
  }
  test::expect_near_normalised(test::columns_of(dproj_out, T, c.dW, c.dcol0, nh), g_ref, bf ? 4e-3 : 2e-6,
                               bf ? 3e-3 : 1e-6, what + " ddt_in");
  test::expect_other_columns_untouched(dproj_out, dproj0.to_floats(), T, c.dW, c.dcol0, nh, what + " dproj");
  if (!c.frozen) {
    test::expect_near_normalised(dbias_runs[0], dbias_ref.to_floats(), 2e-5, 1e-5, what + " ddt_bias");
    test::expect_bitwise_equal(dbias_runs[0], dbias_runs[1], what + " ddt_bias run to run");
  }
}

TEST(CudaMamba2Dt, MatchesCpuBlockLoops) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 5100;
  for (DType dt : {DType::BF16, DType::F32}) {
    DtCase c;
    c.dt = dt, c.param_dt = dt;
    c.T = 37, c.heads = 5, c.W = 20, c.col0 = 13, c.dW = 9, c.dcol0 = 2;  // odd sizes and offsets
    c.seed = seed += 10;
    run_case(c);
    c.T = 2 * 700, c.heads = 64, c.W = 10304, c.col0 = 10240, c.dW = 10304, c.dcol0 = 10240;  // Nemotron's layout
    c.seed = seed += 10;
    run_case(c);
    c.T = 3000, c.heads = 40, c.W = 50, c.col0 = 3, c.dW = 41, c.dcol0 = 1;  // parts of several 8-row strides
    c.param_dt = DType::F32, c.seed = seed += 10;
    run_case(c);
    c.frozen = true, c.seed = seed += 10;
    run_case(c);
  }
}

TEST(CudaMamba2Dt, ZeroTokensAndBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  const Tensor bias = Tensor::empty({4}, DType::BF16, d);
  Tensor proj0 = Tensor::empty({0, 8}, DType::BF16, d), dt0 = Tensor::empty({0, 4}, DType::F32, d);
  cuda::mamba2_dt_forward(proj0, 4, bias, 1e-3, dt0, ctx.stream);
  Tensor dbias = Tensor::empty({4}, DType::F32, d);
  cuda::mamba2_dt_backward(dt0, proj0, 4, bias, 1e-3, proj0, 0, dbias, ctx.stream);
  Tensor proj = Tensor::empty({3, 8}, DType::BF16, d), dt = Tensor::empty({3, 4}, DType::F32, d);
  EXPECT_THROW(cuda::mamba2_dt_forward(proj, 5, bias, 1e-3, dt, ctx.stream), Error);  // past W
  Tensor dt_bf16 = Tensor::empty({3, 4}, DType::BF16, d);
  EXPECT_THROW(cuda::mamba2_dt_forward(proj, 0, bias, 1e-3, dt_bf16, ctx.stream), Error);
  Tensor dproj_f32 = Tensor::empty({3, 8}, DType::F32, d);
  EXPECT_THROW(cuda::mamba2_dt_backward(dt, proj, 0, bias, 1e-3, dproj_f32, 0, dbias, ctx.stream), Error);
}

TEST(CudaMamba2Dt, AMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  for (DType pdt : {DType::BF16, DType::F32}) {
    const int64_t nh = 37;
    std::vector<float> a_log(nh);
    for (int64_t h = 0; h < nh; ++h) a_log[h] = round_bf16(std::log(1.0f + static_cast<float>(h) * 0.4f));
    const Tensor a_log_t = Tensor::from_floats({nh}, a_log).to(pdt);
    const Tensor dA = test::host_random({nh}, 5300, 1.0f);
    const Tensor g0 = test::host_random({nh}, 5301, 0.1f);
    std::vector<float> A_ref(nh), g_ref = g0.to_floats();
    const std::vector<float> dAv = dA.to_floats();
    for (int64_t h = 0; h < nh; ++h) A_ref[h] = -std::exp(a_log[h]), g_ref[h] += dAv[h] * A_ref[h];

    Tensor A = Tensor::empty({nh}, DType::F32, Device::cuda(0));
    cuda::mamba2_a_forward(cuda::to_device(a_log_t, 0), A, ctx.stream);
    test::expect_near_normalised(test::device_floats(A), A_ref, 2e-6, 1e-6, "A");
    Tensor g = cuda::to_device(g0, 0);
    cuda::mamba2_a_backward(cuda::to_device(dA, 0), A, g, ctx.stream);
    test::expect_near_normalised(test::device_floats(g), g_ref, 2e-6, 1e-6, "dA_log");
    Tensor frozen;
    cuda::mamba2_a_backward(cuda::to_device(dA, 0), A, frozen, ctx.stream);  // frozen: nothing to do
    EXPECT_FALSE(frozen.defined());
  }
}

}  // namespace
}  // namespace mt
