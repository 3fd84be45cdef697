// CUDA clamped SwiGLU (GPT-OSS, kernels/cuda/swiglu_oai.h) on the packed [N, 2F] gate|up layout, with and without a
// per-row routing weight, against the CPU reference (cpu::swiglu_oai_*_rows; the weighted form composed on the
// host as swiglu_test does).
// Thresholds: the BF16 forward rounds the same five ops on both sides, but expf differs by an ulp between libm and
// CUDA, which can flip the sigmoid's rounding and move a by a bf16 step or two: max-norm 8e-3 (two bf16 steps),
// rel-L2 2e-3. Backward: the CPU keeps fp32, the device rounds once to bf16: 4e-3 / 3e-3. F32: 1e-5 / 1e-6 (a few
// ulp: expf, and the fma contraction of s + α·g'·s·(1 − s) may differ). The routing-weight gradient is an fp32
// row sum: 2e-3 / 1e-3 in BF16 (a flipped activation moves it), 1e-4 / 1e-5 in F32.
// The clamp boundaries are checked exactly: at ±7 the gradient passes (torch.clamp's rule), one bf16 step outside
// it is exactly zero, on both sides.
#include "kernels/cuda/swiglu_oai.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cpu/swiglu_oai.h"
#include "kernels/cuda/device_context.h"

namespace mt {
namespace {

cudaStream_t stream0() { return cuda::device_context(0).stream; }

struct Expected {
  std::vector<float> out;    // [N, F]
  std::vector<float> dgu;    // [N, 2F]
  std::vector<float> drow;   // [N]
};

// The CPU reference for packed gate_up (host floats), dout, and optional row weights.
Expected reference(const std::vector<float>& gu, const std::vector<float>& dout, const std::vector<float>* w,
                   int64_t N, int64_t F, bool bf16) {
  Expected x;
  x.out.assign(static_cast<size_t>(N * F), 0.0f);
  x.dgu.assign(static_cast<size_t>(N * 2 * F), 0.0f);
  x.drow.assign(static_cast<size_t>(N), 0.0f);
  if (N * F == 0) return x;
  std::vector<float> a(static_cast<size_t>(N * F));
  cpu::swiglu_oai_forward_rows(N, F, gu.data(), gu.data() + F, 2 * F, a.data(), F, bf16);
  std::vector<float> da = dout;
  for (int64_t i = 0; i < N * F; ++i) {
    const float wr = w ? (*w)[i / F] : 1.0f;
    x.out[i] = !w ? a[i] : bf16 ? round_bf16(a[i] * wr) : a[i] * wr;
    da[i] = dout[i] * wr;
  }
  if (w)
    for (int64_t r = 0; r < N; ++r) {
      double s = 0.0;
      for (int64_t c = 0; c < F; ++c) s += static_cast<double>(dout[r * F + c]) * a[r * F + c];
      x.drow[r] = static_cast<float>(s);
    }
  cpu::swiglu_oai_backward_rows(N, F, da.data(), F, gu.data(), gu.data() + F, 2 * F, x.dgu.data(), x.dgu.data() + F,
                                2 * F);
  return x;
}

struct Got {
  std::vector<float> out, dgu, drow;
};

Got run_gpu(const Tensor& gu_host, const Tensor& dout_host, const std::vector<float>* w, int64_t N, int64_t F,
            DType dt) {
  Tensor gu = test::device_from_host(gu_host, dt);
  Tensor dw_row = cuda::to_device(Tensor::from_floats({N}, w ? *w : std::vector<float>(N, 1.0f)), 0);
  Tensor out = Tensor::empty({N, F}, dt, Device::cuda(0));
  cuda::swiglu_oai_forward(gu, w ? &dw_row : nullptr, out, stream0());
  Tensor dgu = Tensor::empty({N, 2 * F}, dt, Device::cuda(0));
  Tensor drow = Tensor::empty({N}, DType::F32, Device::cuda(0));
  cuda::swiglu_oai_backward(test::device_from_host(dout_host, dt), gu, w ? &dw_row : nullptr, dgu,
                            w ? &drow : nullptr, stream0());
  return {test::device_floats(out), test::device_floats(dgu), w ? test::device_floats(drow) : std::vector<float>()};
}

void run_case(int64_t N, int64_t F, bool weighted, DType dt, uint64_t seed) {
  const bool bf = dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + (weighted ? " weighted" : "") + " N=" +
                           std::to_string(N) + " F=" + std::to_string(F);
  // std 4: about 8% of the values lie beyond ±7, so both clamps are exercised.
  Tensor gu = test::host_random({N, 2 * F}, seed, 4.0f, bf);
  Tensor dout = test::host_random({N, F}, seed + 1, 1.0f, bf);
  std::vector<float> w(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) w[r] = round_bf16(0.05f + 0.9f * static_cast<float>((r * 37 + 11) % 97) / 97.0f);
  const Expected want = reference(gu.to_floats(), dout.to_floats(), weighted ? &w : nullptr, N, F, bf);
  const Got got = run_gpu(gu, dout, weighted ? &w : nullptr, N, F, dt);
  test::expect_norm(got.out, want.out, bf ? 8e-3 : 1e-5, bf ? 2e-3 : 1e-6, what + " forward");
  test::expect_norm(got.dgu, want.dgu, bf ? 4e-3 : 1e-5, bf ? 3e-3 : 1e-6, what + " dgate_up");
  if (weighted) test::expect_norm(got.drow, want.drow, bf ? 2e-3 : 1e-4, bf ? 1e-3 : 1e-5, what + " drow_weight");
}

TEST(CudaSwigluOai, MatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 7700;
  // {64, 2880}: GPT-OSS's intermediate size (the 16-byte path); {7, 33}, {129, 100}: scalar paths.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {7, 33}, {64, 2880}, {129, 100}, {3, 3000}, {0, 16}};
  for (DType dt : {DType::BF16, DType::F32})
    for (bool weighted : {false, true})
      for (auto [N, F] : shapes) run_case(N, F, weighted, dt, seed += 10);
}

// Every pair of gate and up values from around the clamp bounds (bf16-representable: 7 ± one bf16 step 1/32).
TEST(CudaSwigluOai, ClampBoundariesExactly) {
  MT_SKIP_WITHOUT_CUDA();
  const std::vector<float> vals = {7.0f, -7.0f, 7.03125f, 6.96875f, -7.03125f, -6.96875f, 0.0f, 100.0f, -20.0f};
  const int64_t n = static_cast<int64_t>(vals.size());
  for (int64_t F : {n * n, int64_t{88}}) {  // 81: the scalar path; 88 (the pairs then padding): the 16-byte path
    std::vector<float> gu(static_cast<size_t>(2 * F), 0.5f), dout(static_cast<size_t>(F), 1.0f);
    for (int64_t i = 0; i < n * n; ++i) gu[i] = vals[i / n], gu[F + i] = vals[i % n];
    for (DType dt : {DType::BF16, DType::F32}) {
      const bool bf = dt == DType::BF16;
      const std::string what = std::string(bf ? "bf16" : "f32") + " F=" + std::to_string(F);
      const Expected want = reference(gu, dout, nullptr, 1, F, bf);
      const Got got =
          run_gpu(Tensor::from_floats({1, 2 * F}, gu), Tensor::from_floats({1, F}, dout), nullptr, 1, F, dt);
      for (int64_t i = 0; i < n * n; ++i) {
        const float g = vals[i / n], u = vals[i % n];
        SCOPED_TRACE(testing::Message() << what << " g " << g << " u " << u);
        EXPECT_EQ(want.dgu[i] == 0.0f, g > 7.0f) << "CPU dg";  // g' = min(g, 7): no gradient above 7 only
        EXPECT_EQ(want.dgu[F + i] == 0.0f, u > 7.0f || u < -7.0f || g == 0.0f) << "CPU du";
        EXPECT_EQ(got.dgu[i] == 0.0f, want.dgu[i] == 0.0f) << "dg zero pattern";
        EXPECT_EQ(got.dgu[F + i] == 0.0f, want.dgu[F + i] == 0.0f) << "du zero pattern";
        EXPECT_NEAR(got.dgu[i], want.dgu[i], (bf ? 4e-3 : 1e-5) * std::max(1.0f, std::fabs(want.dgu[i])));
        EXPECT_NEAR(got.dgu[F + i], want.dgu[F + i], (bf ? 4e-3 : 1e-5) * std::max(1.0f, std::fabs(want.dgu[F + i])));
        EXPECT_NEAR(got.out[i], want.out[i], (bf ? 8e-3 : 1e-5) * std::max(1.0f, std::fabs(want.out[i])));
      }
    }
  }
}

TEST(CudaSwigluOai, RejectsBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  Tensor gu = Tensor::empty({4, 7}, DType::BF16, d);  // odd width
  Tensor out = Tensor::empty({4, 3}, DType::BF16, d);
  EXPECT_THROW(cuda::swiglu_oai_forward(gu, nullptr, out, stream0()), Error);
  Tensor gu2 = Tensor::empty({4, 8}, DType::BF16, d);
  Tensor w_bad = Tensor::empty({3}, DType::F32, d);
  Tensor out2 = Tensor::empty({4, 4}, DType::BF16, d);
  EXPECT_THROW(cuda::swiglu_oai_forward(gu2, &w_bad, out2, stream0()), Error);
  Tensor out_f32 = Tensor::empty({4, 4}, DType::F32, d);
  EXPECT_THROW(cuda::swiglu_oai_forward(gu2, nullptr, out_f32, stream0()), Error);
  Tensor dgu = Tensor::empty({4, 8}, DType::BF16, d), drow = Tensor::empty({4}, DType::F32, d);
  EXPECT_THROW(cuda::swiglu_oai_backward(out2, gu2, nullptr, dgu, &drow, stream0()), Error);  // drow without w
}

}  // namespace
}  // namespace mt
