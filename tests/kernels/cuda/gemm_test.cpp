// cuBLASLt GEMMs (the three linear-layer forms, and the forward with a bias) against the CPU reference
// (cpu::linear_*, sgemm).
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

// y = x·Wᵀ + b (linear_forward_bias) against cpu::linear_forward with a bias (fp32 sum, one rounding), through
// cuBLASLt's bias epilogue (bias of y's dtype) and through the fallback (fp32 GEMM + bias_add_rows: a bias of
// another dtype, or the epilogue switched off). Thresholds as above: the sides differ in accumulation order and,
// for a BF16 output, one rounding of the sum.
TEST(CudaGemm, LinearForwardBiasMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  struct Dt {
    DType in, out, bias;
  };
  const Dt dts[] = {{DType::BF16, DType::BF16, DType::BF16}, {DType::BF16, DType::F32, DType::F32},
                    {DType::F32, DType::F32, DType::F32},    {DType::BF16, DType::BF16, DType::F32},
                    {DType::BF16, DType::F32, DType::BF16}};
  uint64_t seed = 1300;
  for (bool epilogue : {true, false}) {
    cuda::detail::linear_bias_epilogue_set(epilogue);
    for (const auto& c : kCases) {
      for (const Dt& dt : dts) {
        const bool bf_out = dt.out == DType::BF16;
        const std::string what = std::string(epilogue ? "epilogue " : "fallback ") +
                                 std::string(dtype_safetensors_name(dt.in)) + "->" +
                                 std::string(dtype_safetensors_name(dt.out)) + " bias " +
                                 std::string(dtype_safetensors_name(dt.bias)) + " M=" + std::to_string(c.M) +
                                 " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K);
        Tensor x = test::host_random({c.M, c.K}, seed += 10, 1.0f, true);
        Tensor w = test::host_random({c.N, c.K}, seed + 1, 0.1f, true);
        Tensor b = test::host_random({c.N}, seed + 2, 1.0f, true);
        Tensor want = cpu::linear_forward(x, w, b, bf_out);
        Tensor y = Tensor::empty({c.M, c.N}, dt.out, d);
        cuda::linear_forward_bias(test::device_from_host(x, dt.in), test::device_from_host(w, dt.in),
                                  test::device_from_host(b, dt.bias), y, ctx.stream);
        test::expect_near_normalised(test::device_floats(y), want.to_floats(), bf_out ? 4e-3 : 2e-5,
                                     bf_out ? 3e-3 : 5e-6, what);
      }
    }
  }
  cuda::detail::linear_bias_epilogue_set(true);
}

// One rounding, not two: x·w = 1 + 33.25/128 and b = 0.25/128 sum to 1 + 33.5/128, a tie that bf16 rounds to even
// (1 + 34/128 = 1.265625); rounding the product first (1 + 33/128) and then the sum would give 1.2578125.
// Also: K = 0 gives y = b; a bias plan is its own cache entry (a plain GEMM of the same shape adds no bias).
TEST(CudaGemm, LinearForwardBiasRoundsOnceAndCachesApart) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  for (bool epilogue : {true, false}) {
    cuda::detail::linear_bias_epilogue_set(epilogue);
    Tensor x = test::device_from_host(Tensor::from_floats({2, 1}, {1.0f + 1.0f / 128, 1.0f + 1.0f / 128}), DType::BF16);
    Tensor w = test::device_from_host(Tensor::from_floats({1, 1}, {1.25f}), DType::BF16);
    Tensor b = test::device_from_host(Tensor::from_floats({1}, {1.0f / 512}), DType::BF16);
    Tensor y = Tensor::empty({2, 1}, DType::BF16, d);
    cuda::linear_forward_bias(x, w, b, y, ctx.stream);
    EXPECT_EQ(test::device_floats(y), std::vector<float>({1.265625f, 1.265625f}))
        << (epilogue ? "epilogue" : "fallback");
    cuda::linear_forward(x, w, y, ctx.stream);
    EXPECT_EQ(test::device_floats(y), std::vector<float>({1.2578125f, 1.2578125f}))
        << "the plain GEMM after a bias one";

    Tensor x0 = Tensor::empty({3, 0}, DType::BF16, d), w0 = Tensor::empty({2, 0}, DType::BF16, d);
    Tensor b2 = test::device_from_host(Tensor::from_floats({2}, {0.5f, -3.0f}), DType::F32);
    Tensor y0 = Tensor::empty({3, 2}, DType::F32, d);
    cuda::linear_forward_bias(x0, w0, b2, y0, ctx.stream);
    EXPECT_EQ(test::device_floats(y0), std::vector<float>({0.5f, -3.0f, 0.5f, -3.0f, 0.5f, -3.0f})) << "K = 0";
  }
  cuda::detail::linear_bias_epilogue_set(true);
  Tensor x = Tensor::empty({4, 8}, DType::BF16, d), w = Tensor::empty({5, 8}, DType::BF16, d);
  Tensor y = Tensor::empty({4, 5}, DType::BF16, d);
  EXPECT_THROW(cuda::linear_forward_bias(x, w, Tensor::empty({4}, DType::BF16, d), y, ctx.stream), Error);
  EXPECT_THROW(cuda::linear_forward_bias(x, w, Tensor::empty({5}, DType::I32, d), y, ctx.stream), Error);
  EXPECT_THROW(cuda::linear_forward_bias(x, w, Tensor::empty({5}, DType::BF16), y, ctx.stream), Error);  // host bias
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
