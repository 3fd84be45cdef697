// The fused QK-norm + RoPE (qk_norm_rope_forward / _backward) against the two CUDA ops it replaces (bitwise:
// it promises the same roundings) and against the CPU reference (rmsnorm then rope, and back).
// CPU thresholds: forward as rmsnorm_test's bf16 output (8e-3 / 3e-3: the norm's fp32 vs double row sums
// can flip a bf16 rounding, which the rotation carries) with rope's identical roundings on top. Backward: the
// device rounds the rotated gradient to bf16 once before the norm's backward (the CPU keeps fp32), so dx
// carries two roundings (8e-3 / 4e-3) and dw sums of once-rounded terms (3e-3 / 2e-3). F32 takes the
// unfused path: 2e-5 / 5e-6 as the two ops' own tests.
#include <gtest/gtest.h>

#include <span>
#include <string>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"

namespace mt {
namespace {

constexpr float kEps = 1e-6f;

struct Case {
  int64_t T, heads, D;
};

// Positions 0..T-1 restarted halfway (two packed documents).
Tensor positions(int64_t T) {
  Tensor p = Tensor::empty({T}, DType::I64);
  for (int64_t t = 0; t < T; ++t) p.data_as<int64_t>()[t] = t < T / 2 ? t : t - T / 2;
  return p;
}

void run_case(const Case& c, DType dt, uint64_t seed) {
  const bool bf = dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + " T=" + std::to_string(c.T) +
                           " heads=" + std::to_string(c.heads) + " D=" + std::to_string(c.D);
  auto& ctx = cuda::device_context(0);
  const Device gpu = Device::cuda(0);
  const double theta = 1e6;
  Tensor pos = positions(c.T);
  cpu::RopeTables ref = cpu::rope_tables(pos, c.D, theta, bf);
  Tensor cos = Tensor::empty({c.T, c.D / 2}, DType::F32, gpu), sin = Tensor::empty({c.T, c.D / 2}, DType::F32, gpu);
  cuda::rope_tables(cuda::to_device(pos, 0), c.D, theta, bf, cos, sin, ctx.stream);

  Tensor x = test::host_random({c.T, c.heads, c.D}, seed, 1.5f, bf);
  Tensor w = test::host_random({c.D}, seed + 1, 0.3f, bf);
  for (float& v : std::span(w.data_as<float>(), c.D)) v = bf ? round_bf16(v + 1.0f) : v + 1.0f;
  Tensor dx_in = test::device_from_host(x, dt), dw_in = test::device_from_host(w, dt);

  // Forward: fused vs the two ops vs the CPU.
  Tensor fused = Tensor::empty(x.shape(), dt, gpu), two = Tensor::empty(x.shape(), dt, gpu);
  cuda::qk_norm_rope_forward(dx_in, dw_in, kEps, cos, sin, fused, ctx.stream);
  cuda::rmsnorm_forward(dx_in, dw_in, kEps, two, nullptr, ctx.stream);
  cuda::rope_forward(two, cos, sin, two, ctx.stream);
  const std::vector<float> got = test::device_floats(fused);
  EXPECT_EQ(got, test::device_floats(two)) << what << " forward vs rmsnorm + rope";
  Tensor want = cpu::rope_forward(cpu::rmsnorm_forward(x, w, kEps, bf), ref, bf);
  test::expect_near_normalised(got, want.to_floats(), bf ? 8e-3 : 2e-5, bf ? 3e-3 : 5e-6, what + " forward vs CPU");

  // Backward (dw accumulates onto a non-zero start): fused vs the two ops vs the CPU, then in place.
  Tensor dy = test::host_random({c.T, c.heads, c.D}, seed + 2, 1.0f, bf);
  Tensor dw0 = test::host_random({c.D}, seed + 3, 1.0f);
  Tensor ddy = test::device_from_host(dy, dt);
  Tensor ddx = Tensor::empty(x.shape(), dt, gpu), ddw = test::device_from_host(dw0, DType::F32);
  cuda::qk_norm_rope_backward(ddy, dx_in, dw_in, kEps, cos, sin, ddx, ddw, ctx.stream);
  Tensor two_dn = Tensor::empty(x.shape(), dt, gpu), two_dx = Tensor::empty(x.shape(), dt, gpu);
  Tensor two_dw = test::device_from_host(dw0, DType::F32);
  cuda::rope_backward(ddy, cos, sin, two_dn, ctx.stream);
  cuda::rmsnorm_backward(two_dn, dx_in, dw_in, kEps, two_dx, two_dw, nullptr, ctx.stream);
  const std::vector<float> got_dx = test::device_floats(ddx), got_dw = test::device_floats(ddw);
  EXPECT_EQ(got_dx, test::device_floats(two_dx)) << what << " dx vs rope_backward + rmsnorm_backward";
  EXPECT_EQ(got_dw, test::device_floats(two_dw)) << what << " dw vs rope_backward + rmsnorm_backward";

  Tensor dw_cpu = dw0.clone();
  Tensor dx_cpu = cpu::rmsnorm_backward(cpu::rope_backward(dy, ref), x, w, kEps, dw_cpu);
  test::expect_near_normalised(got_dx, dx_cpu.to_floats(), bf ? 8e-3 : 2e-5, bf ? 4e-3 : 5e-6, what + " dx vs CPU");
  test::expect_near_normalised(got_dw, dw_cpu.to_floats(), bf ? 3e-3 : 1e-4, bf ? 2e-3 : 1e-5, what + " dw vs CPU");

  Tensor dw_again = test::device_from_host(dw0, DType::F32);
  cuda::qk_norm_rope_backward(ddy, dx_in, dw_in, kEps, cos, sin, ddy, dw_again, ctx.stream);  // dx over dy
  EXPECT_EQ(test::device_floats(ddy), got_dx) << what << " in-place dx";
  EXPECT_EQ(test::device_floats(dw_again), got_dw) << what << " in-place dw";
}

// D 128 (Qwen3: 16 lanes a row), 64, 256 (a whole warp), 32 and 16 (two lanes) take the fused kernels, with
// partial last groups (odd rows) and, at 4100 tokens × 8 heads, several rows per backward worker; D 96 (12
// packets) and F32 the two ops.
TEST(CudaQkNormRope, MatchesTheTwoOpsAndTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 900;
  for (const Case& c : {Case{37, 4, 128}, Case{29, 3, 64}, Case{5, 3, 256}, Case{13, 8, 32}, Case{9, 1, 16},
                        Case{4100, 8, 128}, Case{7, 2, 96}})
    run_case(c, DType::BF16, seed += 10);
  run_case({37, 4, 128}, DType::F32, seed += 10);
}

TEST(CudaQkNormRope, RejectsTablesOfTheWrongShape) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device gpu = Device::cuda(0);
  Tensor x = Tensor::empty({6, 2, 128}, DType::BF16, gpu), w = Tensor::empty({128}, DType::BF16, gpu);
  Tensor out = Tensor::empty(x.shape(), DType::BF16, gpu), dw = Tensor::empty({128}, DType::F32, gpu);
  Tensor narrow = Tensor::empty({6, 32}, DType::F32, gpu);     // D/2 should be 64
  Tensor five = Tensor::empty({5, 64}, DType::F32, gpu);       // 5 tokens do not divide 12 rows
  Tensor halfprec = Tensor::empty({6, 64}, DType::BF16, gpu);  // tables are F32
  for (const Tensor* t : {&narrow, &five, &halfprec}) {
    EXPECT_THROW(cuda::qk_norm_rope_forward(x, w, kEps, *t, *t, out, ctx.stream), Error);
    EXPECT_THROW(cuda::qk_norm_rope_backward(x, x, w, kEps, *t, *t, out, dw, ctx.stream), Error);
  }
}

}  // namespace
}  // namespace mt
