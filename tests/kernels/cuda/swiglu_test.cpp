// CUDA SwiGLU on the packed [N, 2F] gate|up layout, with and without a per-row routing weight, against
// the CPU reference (cpu::swiglu_*; the weighted form composed on the host).
// Thresholds: BF16 forward carries the same roundings on both sides, but expf differs by an ulp
// between libm and CUDA, which can flip a rounding: max-norm 8e-3 (two bf16 steps), rel-L2 2e-3.
// Backward: the CPU keeps fp32, the device rounds once to bf16: 4e-3 / 3e-3. F32: 1e-5 / 1e-6.
// The routing-weight gradient is an fp32 row sum (of bf16-rounded activations in BF16): 2e-3 / 1e-3
// in BF16 (a flipped activation moves it), 1e-4 / 1e-5 in F32 (an F-long fp32 row sum).
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/swiglu.h"

namespace mt {
namespace {

void run_case(int64_t N, int64_t F, bool weighted, DType dt, uint64_t seed) {
  const bool bf = dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + (weighted ? " weighted" : "") + " N=" +
                           std::to_string(N) + " F=" + std::to_string(F);
  auto& ctx = cuda::device_context(0);
  Tensor gu = test::host_random({N, 2 * F}, seed, 2.0f, bf);
  std::vector<float> guv = gu.to_floats(), gv, uv;
  for (int64_t r = 0; r < N; ++r) {
    gv.insert(gv.end(), guv.begin() + r * 2 * F, guv.begin() + r * 2 * F + F);
    uv.insert(uv.end(), guv.begin() + r * 2 * F + F, guv.begin() + (r + 1) * 2 * F);
  }
  Tensor g = Tensor::from_floats({N, F}, gv), u = Tensor::from_floats({N, F}, uv);
  std::vector<float> w(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) w[r] = round_bf16(0.05f + 0.9f * static_cast<float>((r * 37 + 11) % 97) / 97.0f);

  Tensor a = cpu::swiglu_forward(g, u, bf);
  std::vector<float> want = a.to_floats();
  if (weighted)
    for (int64_t i = 0; i < N * F; ++i) want[i] = bf ? round_bf16(want[i] * w[i / F]) : want[i] * w[i / F];

  Tensor dgu = test::device_from_host(gu, dt);
  Tensor dw_row = cuda::to_device(Tensor::from_floats({N}, w), 0);
  Tensor out = Tensor::empty({N, F}, dt, Device::cuda(0));
  cuda::swiglu_forward(dgu, weighted ? &dw_row : nullptr, out, ctx.stream);
  test::expect_near_normalised(test::device_floats(out), want, bf ? 8e-3 : 1e-5, bf ? 2e-3 : 1e-6, what + " forward");

  // Backward.
  Tensor dout = test::host_random({N, F}, seed + 1, 1.0f, bf);
  std::vector<float> doutv = dout.to_floats(), da = doutv, drow(static_cast<size_t>(N), 0.0f);
  std::vector<float> av = a.to_floats();
  if (weighted) {
    for (int64_t i = 0; i < N * F; ++i) da[i] = doutv[i] * w[i / F];
    for (int64_t r = 0; r < N; ++r) {
      double s = 0.0;
      for (int64_t c = 0; c < F; ++c) s += static_cast<double>(doutv[r * F + c]) * av[r * F + c];
      drow[r] = static_cast<float>(s);
    }
  }
  Tensor dg, du;
  cpu::swiglu_backward(Tensor::from_floats({N, F}, da), g, u, dg, du);
  std::vector<float> dgv = dg.to_floats(), duv = du.to_floats(), dwant;
  for (int64_t r = 0; r < N; ++r) {
    dwant.insert(dwant.end(), dgv.begin() + r * F, dgv.begin() + (r + 1) * F);
    dwant.insert(dwant.end(), duv.begin() + r * F, duv.begin() + (r + 1) * F);
  }
  Tensor ddout = test::device_from_host(dout, dt);
  Tensor dgu_out = Tensor::empty({N, 2 * F}, dt, Device::cuda(0));
  Tensor ddrow = Tensor::empty({N}, DType::F32, Device::cuda(0));
  cuda::swiglu_backward(ddout, dgu, weighted ? &dw_row : nullptr, dgu_out, weighted ? &ddrow : nullptr, ctx.stream);
  test::expect_near_normalised(test::device_floats(dgu_out), dwant, bf ? 4e-3 : 1e-5, bf ? 3e-3 : 1e-6,
                               what + " dgate_up");
  if (weighted)
    test::expect_near_normalised(test::device_floats(ddrow), drow, bf ? 2e-3 : 1e-4, bf ? 1e-3 : 1e-5,
                                 what + " drow_weight");
}

TEST(CudaSwiglu, MatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 700;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {7, 33}, {64, 768}, {129, 100}, {3, 3000}, {0, 16}};
  for (DType dt : {DType::BF16, DType::F32})
    for (bool weighted : {false, true})
      for (auto [N, F] : shapes) run_case(N, F, weighted, dt, seed += 10);
}

TEST(CudaSwiglu, RejectsBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  Tensor gu = Tensor::empty({4, 7}, DType::BF16, Device::cuda(0));  // odd width
  Tensor out = Tensor::empty({4, 3}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::swiglu_forward(gu, nullptr, out, ctx.stream), Error);
  Tensor gu2 = Tensor::empty({4, 8}, DType::BF16, Device::cuda(0));
  Tensor w_bad = Tensor::empty({3}, DType::F32, Device::cuda(0));
  Tensor out2 = Tensor::empty({4, 4}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::swiglu_forward(gu2, &w_bad, out2, ctx.stream), Error);
  Tensor out_f32 = Tensor::empty({4, 4}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::swiglu_forward(gu2, nullptr, out_f32, ctx.stream), Error);
}

}  // namespace
}  // namespace mt
