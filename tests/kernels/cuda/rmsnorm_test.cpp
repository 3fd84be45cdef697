// CUDA RMSNorm (+ fused residual add, QK-norm shapes) against the CPU reference.
// Thresholds: BF16 outputs carry HF's two roundings; the device sums x² in fp32 (the CPU in double),
// so an element can land one bf16 step (2^-8 relative) away, twice: max-norm 8e-3 (about two bf16 ulps
// of the largest value), rel-L2 3e-3 (such flips are rare). F32: 2e-5 / 5e-6 (rsqrtf's 2 ulp and the
// fp32 row sums of the backward).
// dw is fp32 on both sides (sums over rows): 1e-4 / 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"

namespace mt {
namespace {

struct NormCase {
  int64_t rows, n;
};
// Widths 128, 64, 1024, 1536, 2048, 4096 take the bf16 register path (rows of 2048 and 5,000 QK-norm rows: several
// rows per worker and masked tail rows; 1024, 1536 and 2048 hold 4, 6 and 8 packets per lane);
// 1, 33, 1000 the per-element kernels.
const NormCase kCases[] = {{1, 1},     {7, 33},      {26 * 5, 128}, {65, 1000},  {3, 4096},
                           {300, 64},  {4100, 2048}, {5000, 128},   {1500, 1024}, {2100, 1536}};
constexpr float kEps = 1e-6f;

void run_case(const NormCase& c, DType dt, bool residual, uint64_t seed) {
  const bool bf = dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + (residual ? " residual" : "") + " rows=" +
                           std::to_string(c.rows) + " n=" + std::to_string(c.n);
  auto& ctx = cuda::device_context(0);
  Tensor x = test::host_random({c.rows, c.n}, seed, 1.5f, bf);
  Tensor r = test::host_random({c.rows, c.n}, seed + 1, 1.0f, bf);
  Tensor w = test::host_random({c.n}, seed + 2, 0.3f, bf);
  for (float& v : std::span(w.data_as<float>(), c.n)) v = bf ? round_bf16(v + 1.0f) : v + 1.0f;

  // CPU reference.
  Tensor h = residual ? cpu::residual_add(x, r, bf) : x;
  Tensor want = cpu::rmsnorm_forward(h, w, kEps, bf);

  Tensor dx_ = test::device_from_host(x, dt), dr = test::device_from_host(r, dt), dw_ = test::device_from_host(w, dt);
  Tensor out = Tensor::empty(x.shape(), dt, Device::cuda(0));
  Tensor sum = Tensor::empty(x.shape(), dt, Device::cuda(0));
  Tensor rstd = Tensor::empty({c.rows}, DType::F32, Device::cuda(0));
  if (residual)
    cuda::rmsnorm_residual_forward(dx_, dr, dw_, kEps, sum, out, &rstd, ctx.stream);
  else
    cuda::rmsnorm_forward(dx_, dw_, kEps, out, &rstd, ctx.stream);
  const double tol = bf ? 8e-3 : 2e-5, l2 = bf ? 3e-3 : 5e-6;
  test::expect_near_normalised(test::device_floats(out), want.to_floats(), tol, l2, what + " out");
  if (residual) test::expect_near_normalised(test::device_floats(sum), h.to_floats(), 0.0, 0.0, what + " sum");

  // Backward (dw accumulates onto a non-zero start).
  Tensor dy = test::host_random({c.rows, c.n}, seed + 3, 1.0f, bf);
  Tensor dres = test::host_random({c.rows, c.n}, seed + 4, 0.5f, bf);
  Tensor dw0 = test::host_random({c.n}, seed + 5, 1.0f);
  Tensor dw_cpu = dw0.clone();
  Tensor dx_cpu = cpu::rmsnorm_backward(dy, h, w, kEps, dw_cpu);
  if (residual) cpu::add_inplace(dx_cpu, dres);
  Tensor ddy = test::device_from_host(dy, dt), ddres = test::device_from_host(dres, dt);
  Tensor dh = test::device_from_host(h, dt);
  Tensor ddw = test::device_from_host(dw0, DType::F32);
  Tensor ddx = Tensor::empty(x.shape(), dt, Device::cuda(0));
  cuda::rmsnorm_backward(ddy, dh, dw_, kEps, ddx, ddw, residual ? &ddres : nullptr, ctx.stream);
  if (c.n == 1 && !residual && !bf) {
    // F32, one element per row, no residual: y = w·sign(x) has dx = 0 exactly; both sides hold rounding noise of the
    // cancellation (measured on the H200: ~2e-8 against dy·w ~ 1), so compare on that scale.
    for (float v : test::device_floats(ddx)) EXPECT_LE(std::abs(v), 1e-5f) << what << " dx";
  } else {
    test::expect_near_normalised(test::device_floats(ddx), dx_cpu.to_floats(), bf ? 4e-3 : 2e-5, bf ? 3e-3 : 5e-6,
                                 what + " dx");
  }
  test::expect_near_normalised(test::device_floats(ddw), dw_cpu.to_floats(), 1e-4, 1e-5, what + " dw");
  // In place: dx over dy gives the same result.
  cuda::rmsnorm_backward(ddy, dh, dw_, kEps, ddy, ddw, residual ? &ddres : nullptr, ctx.stream);
  EXPECT_EQ(test::device_floats(ddy), test::device_floats(ddx)) << what << " in-place dx";
}

TEST(CudaRmsnorm, MatchesCpuBf16) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 100;
  for (const auto& c : kCases) run_case(c, DType::BF16, false, seed += 10);
}

TEST(CudaRmsnorm, MatchesCpuF32) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 200;
  for (const auto& c : kCases) run_case(c, DType::F32, false, seed += 10);
}

TEST(CudaRmsnorm, ResidualVariantMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 300;
  for (const auto& c : kCases) {
    run_case(c, DType::BF16, true, seed += 10);
    run_case(c, DType::F32, true, seed += 10);
  }
}

// GPT-OSS's RMSNorm (round_once: out = bf16(w · (x·rstd)), one rounding) against cpu::rmsnorm_forward(...,
// bf16_round_once = true), plain and with the fused residual add, in the rows-in-registers kernel (n = 2048, 128)
// and the per-row kernel (n = 2880, GPT-OSS's hidden size, and odd widths). One rounding: an element lands at most
// one bf16 step (2^-8 of itself) away when the fp32-vs-double x² sums move it across a rounding boundary: max-norm
// 4e-3, rel-L2 2e-3; F32 as above. The backward is the same op for both roundings (fp32 on x, cpu::rmsnorm_backward
// takes no rounding flag), covered above. The flag must matter: in BF16 the two roundings differ from the one on
// some elements of every large case (and never in F32).
TEST(CudaRmsnorm, RoundOnceMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const NormCase cases[] = {{1, 1}, {7, 33}, {65, 1000}, {300, 2880}, {4100, 2048}, {5000, 128}};
  const float eps = 1e-5f;  // GPT-OSS's rms_norm_eps
  uint64_t seed = 2500;
  for (const NormCase& c : cases) {
    for (DType dt : {DType::BF16, DType::F32}) {
      for (bool residual : {false, true}) {
        const bool bf = dt == DType::BF16;
        const std::string what = std::string(bf ? "bf16" : "f32") + (residual ? " residual" : "") + " rows=" +
                                 std::to_string(c.rows) + " n=" + std::to_string(c.n);
        Tensor x = test::host_random({c.rows, c.n}, seed += 10, 1.5f, bf);
        Tensor r = test::host_random({c.rows, c.n}, seed + 1, 1.0f, bf);
        Tensor w = test::host_random({c.n}, seed + 2, 0.3f, bf);
        for (float& v : std::span(w.data_as<float>(), c.n)) v = bf ? round_bf16(v + 1.0f) : v + 1.0f;
        Tensor h = residual ? cpu::residual_add(x, r, bf) : x;
        Tensor want = cpu::rmsnorm_forward(h, w, eps, bf, true);
        Tensor dx_ = test::device_from_host(x, dt), dr = test::device_from_host(r, dt);
        Tensor dw_ = test::device_from_host(w, dt);
        Tensor out = Tensor::empty(x.shape(), dt, Device::cuda(0));
        Tensor twice = Tensor::empty(x.shape(), dt, Device::cuda(0));
        Tensor sum = Tensor::empty(x.shape(), dt, Device::cuda(0));
        if (residual) {
          cuda::rmsnorm_residual_forward(dx_, dr, dw_, eps, sum, out, nullptr, ctx.stream, true);
          test::expect_near_normalised(test::device_floats(sum), h.to_floats(), 0.0, 0.0, what + " sum");
          cuda::rmsnorm_residual_forward(dx_, dr, dw_, eps, sum, twice, nullptr, ctx.stream);
        } else {
          cuda::rmsnorm_forward(dx_, dw_, eps, out, nullptr, ctx.stream, true);
          cuda::rmsnorm_forward(dx_, dw_, eps, twice, nullptr, ctx.stream);
        }
        const std::vector<float> got = test::device_floats(out), got2 = test::device_floats(twice);
        test::expect_near_normalised(got, want.to_floats(), bf ? 4e-3 : 2e-5, bf ? 2e-3 : 5e-6, what + " out");
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += got[i] != got2[i];
        if (!bf) {
          EXPECT_EQ(differ, 0u) << what << ": round_once changed an F32 result";
        } else if (c.rows * c.n >= 10000) {
          EXPECT_GT(differ, 0u) << what << ": round_once changed nothing";
        }
      }
    }
  }
}

// Attention's QK-norm + RoPE in one pass (rmsnorm_rope_forward / _backward) against the two kernels it replaces,
// bit for bit: out, dx and dw (accumulated onto a non-zero start). Head dims 128 (query- and key-like head counts),
// 64 and 16 take the fused rows; 96 falls back to the two kernels. The forward runs with every rows-per-group choice
// (the shape's own, 1, 2, 4; a head count that 2 or 4 does not divide falls back to 1); the largest cases give the
// shape's own choice 2 (67k rows) and 1, and the backward more rows than workers (each prefetching its next row). The
// positions restart mid-batch (packed documents), with bf16 and fp32 tables.
TEST(CudaRmsnorm, RopeFusedIsNormThenRope) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  struct RopeCase {
    int64_t T, heads, D;
    bool bf16_tables;
  };
  const RopeCase cases[] = {{37, 32, 128, true}, {1100, 4, 128, true}, {5, 3, 64, false}, {9, 2, 16, true},
                            {7, 2, 96, true},    {2100, 32, 128, true}, {4100, 4, 128, false}};
  struct RowsPerGroupScope {
    ~RowsPerGroupScope() { cuda::detail::rmsnorm_rope_rows_per_group_set(0); }
  } restore;
  uint64_t seed = 900;
  for (const RopeCase& c : cases) {
    const std::string what = "T=" + std::to_string(c.T) + " heads=" + std::to_string(c.heads) + " D=" +
                             std::to_string(c.D);
    std::vector<int64_t> pos_v;
    for (int64_t t = 0; t < c.T; ++t) pos_v.push_back(t < c.T / 2 ? t + 3 : t - c.T / 2);
    Tensor pos = Tensor::empty({c.T}, DType::I64);
    std::copy(pos_v.begin(), pos_v.end(), pos.data_as<int64_t>());
    Tensor cos = Tensor::empty({c.T, c.D / 2}, DType::F32, Device::cuda(0));
    Tensor sin = Tensor::empty({c.T, c.D / 2}, DType::F32, Device::cuda(0));
    cuda::rope_tables(cuda::to_device(pos, 0), c.D, 1e6, c.bf16_tables, cos, sin, ctx.stream);
    const int64_t rows = c.T * c.heads;
    Tensor x = test::device_from_host(test::host_random({rows, c.D}, seed += 10, 1.5f, true), DType::BF16);
    Tensor wh = test::host_random({c.D}, seed + 1, 0.3f, true);
    for (float& v : std::span(wh.data_as<float>(), c.D)) v = round_bf16(v + 1.0f);
    Tensor w = test::device_from_host(wh, DType::BF16);

    Tensor two = Tensor::empty({rows, c.D}, DType::BF16, Device::cuda(0));
    cuda::rmsnorm_forward(x, w, kEps, two, nullptr, ctx.stream);
    cuda::rope_forward(two, cos, sin, two, ctx.stream);
    const std::vector<float> expect = test::device_floats(two);
    for (const int rows_per_group : {0, 1, 2, 4}) {
      cuda::detail::rmsnorm_rope_rows_per_group_set(rows_per_group);
      Tensor one = Tensor::empty({rows, c.D}, DType::BF16, Device::cuda(0));
      cuda::rmsnorm_rope_forward(x, w, kEps, cos, sin, one, ctx.stream);
      EXPECT_EQ(test::device_floats(one), expect) << what << " forward, rows per group " << rows_per_group;
    }
    cuda::detail::rmsnorm_rope_rows_per_group_set(0);

    Tensor dy = test::device_from_host(test::host_random({rows, c.D}, seed + 2, 1.0f, true), DType::BF16);
    Tensor dw0 = test::host_random({c.D}, seed + 3, 1.0f);
    Tensor dw_two = test::device_from_host(dw0, DType::F32), dw_one = test::device_from_host(dw0, DType::F32);
    Tensor unrot = Tensor::empty({rows, c.D}, DType::BF16, Device::cuda(0));
    cuda::rope_backward(dy, cos, sin, unrot, ctx.stream);
    Tensor dx_two = Tensor::empty({rows, c.D}, DType::BF16, Device::cuda(0));
    cuda::rmsnorm_backward(unrot, x, w, kEps, dx_two, dw_two, nullptr, ctx.stream);
    Tensor dx_one = Tensor::empty({rows, c.D}, DType::BF16, Device::cuda(0));
    cuda::rmsnorm_rope_backward(dy, x, w, kEps, cos, sin, dx_one, dw_one, ctx.stream);
    EXPECT_EQ(test::device_floats(dx_one), test::device_floats(dx_two)) << what << " dx";
    EXPECT_EQ(test::device_floats(dw_one), test::device_floats(dw_two)) << what << " dw";
  }
}

TEST(CudaRmsnorm, RejectsMismatchedTensors) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  Tensor x = Tensor::empty({4, 8}, DType::BF16, Device::cuda(0));
  Tensor w = Tensor::empty({7}, DType::BF16, Device::cuda(0));
  Tensor out = Tensor::empty({4, 8}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::rmsnorm_forward(x, w, kEps, out, nullptr, ctx.stream), Error);
  Tensor w32 = Tensor::empty({8}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::rmsnorm_forward(x, w32, kEps, out, nullptr, ctx.stream), Error);
  Tensor host = Tensor::empty({4, 8}, DType::BF16);
  Tensor w8 = Tensor::empty({8}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::rmsnorm_forward(host, w8, kEps, out, nullptr, ctx.stream), Error);
}

}  // namespace
}  // namespace mt
