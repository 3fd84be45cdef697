// cuBLASLt GEMMs (the three linear-layer forms) against the CPU reference (cpu::linear_*, sgemm).
// Inputs are bf16-representable, so both sides multiply the same numbers; they differ in fp32
// accumulation order (relative ~1e-6 of the row's magnitude) and, for a BF16 output, one rounding:
//   BF16 out: max-norm 4e-3 (one bf16 step of the largest value plus order), rel-L2 3e-3.
//   F32 out:  max-norm 2e-5, rel-L2 5e-6 (a K-long fp32 dot product carries ~u·√K relative rounding
//   noise on each side; F32 inputs use CUBLAS_COMPUTE_32F: no TF32).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/gemm.h"

namespace mt {
namespace {

struct GemmCase {
  int64_t M, N, K;  // rows, out features, in features
};
const GemmCase kCases[] = {{1, 1, 1}, {7, 33, 65}, {130, 257, 96}, {64, 128, 512}, {5, 3, 1031}, {0, 8, 8}};

void run_case(const GemmCase& c, DType in_dt, DType out_dt, uint64_t seed) {
  const bool bf_in = in_dt == DType::BF16, bf_out = out_dt == DType::BF16;
  const std::string what = std::string(bf_in ? "bf16" : "f32") + "->" + (bf_out ? "bf16" : "f32") + " M=" +
                           std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K);
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  Tensor x = test::host_random({c.M, c.K}, seed, 1.0f, true);
  Tensor w = test::host_random({c.N, c.K}, seed + 1, 0.1f, true);
  Tensor dx_ = test::device_from_host(x, in_dt), dw_ = test::device_from_host(w, in_dt);
  const double tol = bf_out ? 4e-3 : 2e-5, l2 = bf_out ? 3e-3 : 5e-6;

  // y = x·Wᵀ
  Tensor want = cpu::linear_forward(x, w, bf_out);
  Tensor y = Tensor::empty({c.M, c.N}, out_dt, d);
  cuda::linear_forward(dx_, dw_, y, ctx.stream);
  test::expect_near_normalised(test::device_floats(y), want.to_floats(), tol, l2, what + " forward");

  // dx = dy·W, dW += dyᵀ·x (dW fp32, accumulating onto a non-zero start)
  Tensor dy = test::host_random({c.M, c.N}, seed + 2, 1.0f, true);
  Tensor dx_cpu = Tensor::empty({c.M, c.K}, DType::F32);
  Tensor dw0 = test::host_random({c.N, c.K}, seed + 3, 1.0f);
  Tensor dw_cpu = dw0.clone();
  cpu::linear_backward(dy, x, w, &dx_cpu, &dw_cpu);
  Tensor ddy = test::device_from_host(dy, in_dt);
  Tensor ddx = Tensor::empty({c.M, c.K}, out_dt, d);
  cuda::linear_backward_input(ddy, dw_, ddx, ctx.stream);
  test::expect_near_normalised(test::device_floats(ddx), dx_cpu.to_floats(), tol, l2, what + " dx");
  Tensor ddw = cuda::to_device(dw0, 0);
  cuda::linear_backward_weight(ddy, dx_, ddw, ctx.stream, 1.0f);
  test::expect_near_normalised(test::device_floats(ddw), dw_cpu.to_floats(), 2e-5, 5e-6, what + " dW (fp32, beta 1)");
}

TEST(CudaGemm, LinearFormsMatchCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 1100;
  for (const auto& c : kCases) {
    run_case(c, DType::BF16, DType::BF16, seed += 10);
    run_case(c, DType::BF16, DType::F32, seed += 10);
    run_case(c, DType::F32, DType::F32, seed += 10);
  }
}

TEST(CudaGemm, MisalignedViewsAndPlanCache) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const int64_t M = 20, N = 24, K = 33;  // K odd: row 1 of a bf16 [M, K] starts 2-byte aligned
  Tensor x = test::host_random({M, K}, 1, 1.0f, true), w = test::host_random({N, K}, 2, 0.1f, true);
  Tensor dx_ = test::device_from_host(x, DType::BF16), dw_ = test::device_from_host(w, DType::BF16);
  Tensor want = cpu::linear_forward(x.rows(1, M), w, false);
  Tensor y = Tensor::empty({M - 1, N}, DType::F32, Device::cuda(0));
  cuda::linear_forward(dx_.rows(1, M), dw_, y, ctx.stream);
  test::expect_near_normalised(test::device_floats(y), want.to_floats(), 2e-5, 5e-6, "misaligned x");
  const int64_t plans = cuda::gemm_plan_count();
  cuda::linear_forward(dx_.rows(1, M), dw_, y, ctx.stream);
  EXPECT_EQ(cuda::gemm_plan_count(), plans) << "the same GEMM built a second plan";
  // The benches' description of the plan's algorithm: the heuristic's first unless MIXTUNE_GEMM_ALGO_RANK says.
  const std::string algo = cuda::gemm_plan_description(M - 1, N, K);
  EXPECT_EQ(algo.rfind(std::getenv("MIXTUNE_GEMM_ALGO_RANK") ? "rank " : "rank 0 of ", 0), 0u) << algo;
  EXPECT_NE(algo.find(" tile "), std::string::npos) << algo;
  EXPECT_EQ(cuda::gemm_plan_description(M + 1000, N, K), "no plan");
}

TEST(CudaGemm, EmptyInnerDimension) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  Tensor x = Tensor::empty({9, 0}, DType::BF16, d), w = Tensor::empty({4, 0}, DType::BF16, d);
  Tensor y = cuda::to_device(Tensor::from_floats({9, 4}, std::vector<float>(36, 5.0f)), 0);
  cuda::linear_forward(x, w, y, ctx.stream);  // beta 0: C = 0
  EXPECT_EQ(test::device_floats(y), std::vector<float>(36, 0.0f));
  Tensor dy = Tensor::empty({0, 4}, DType::BF16, d), x0 = Tensor::empty({0, 3}, DType::BF16, d);
  Tensor dw = cuda::to_device(Tensor::from_floats({4, 3}, std::vector<float>(12, 2.0f)), 0);
  cuda::linear_backward_weight(dy, x0, dw, ctx.stream, 1.0f);  // no rows: dW unchanged
  EXPECT_EQ(test::device_floats(dw), std::vector<float>(12, 2.0f));
}

TEST(CudaGemm, RejectsMismatchedShapes) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  Tensor x = Tensor::empty({4, 8}, DType::BF16, d), w = Tensor::empty({5, 7}, DType::BF16, d);
  Tensor y = Tensor::empty({4, 5}, DType::BF16, d);
  EXPECT_THROW(cuda::linear_forward(x, w, y, ctx.stream), Error);
  Tensor w8 = Tensor::empty({5, 8}, DType::F32, d);
  EXPECT_THROW(cuda::linear_forward(x, w8, y, ctx.stream), Error);  // mixed operand dtypes
}

}  // namespace
}  // namespace mt
