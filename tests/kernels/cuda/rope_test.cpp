// CUDA RoPE (tables from per-document positions, forward, backward) against the CPU reference.
// The tables use the same host-computed inv_freq and correctly rounded cos/sin, so they agree to an
// fp32 ulp (1e-6) and exactly after bf16 rounding (checked to 1e-6 too: a flip would be a bug).
// BF16 forward: identical roundings on both sides, max-norm 4e-3 (one bf16 step, should a table value
// differ by an ulp), rel-L2 1e-3. Backward: the CPU keeps fp32, the device rounds once to bf16:
// 4e-3 / 3e-3. F32: 1e-5 / 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/rope.h"

namespace mt {
namespace {

// Packed documents: positions restart at 0 for each length in `docs`, the first starting at `start`.
Tensor doc_positions(const std::vector<int64_t>& docs, int64_t start) {
  std::vector<int64_t> p;
  for (size_t d = 0; d < docs.size(); ++d)
    for (int64_t i = 0; i < docs[d]; ++i) p.push_back((d == 0 ? start : 0) + i);
  Tensor t = Tensor::empty({static_cast<int64_t>(p.size())}, DType::I64);
  std::copy(p.begin(), p.end(), t.data_as<int64_t>());
  return t;
}

std::vector<float> first_half(const Tensor& full) {
  const int64_t T = full.dim(0), D = full.dim(1);
  std::vector<float> v = full.to_floats(), r;
  for (int64_t t = 0; t < T; ++t) r.insert(r.end(), v.begin() + t * D, v.begin() + t * D + D / 2);
  return r;
}

void run_case(const std::vector<int64_t>& docs, int64_t start, int64_t heads, int64_t D, double theta, DType dt,
              uint64_t seed) {
  const bool bf = dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + " heads=" + std::to_string(heads) +
                           " D=" + std::to_string(D) + " start=" + std::to_string(start);
  auto& ctx = cuda::device_context(0);
  Tensor pos = doc_positions(docs, start);
  const int64_t T = pos.numel();
  cpu::RopeTables ref = cpu::rope_tables(pos, D, theta, bf);
  Tensor cos = Tensor::empty({T, D / 2}, DType::F32, Device::cuda(0));
  Tensor sin = Tensor::empty({T, D / 2}, DType::F32, Device::cuda(0));
  cuda::rope_tables(cuda::to_device(pos, 0), D, theta, bf, cos, sin, ctx.stream);
  test::expect_near_normalised(test::device_floats(cos), first_half(ref.cos), 1e-6, 1e-7, what + " cos");
  test::expect_near_normalised(test::device_floats(sin), first_half(ref.sin), 1e-6, 1e-7, what + " sin");
  // I32 positions give the same tables.
  Tensor pos32 = Tensor::empty({T}, DType::I32);
  for (int64_t i = 0; i < T; ++i) pos32.data_as<int32_t>()[i] = static_cast<int32_t>(pos.data_as<int64_t>()[i]);
  Tensor cos32 = Tensor::empty({T, D / 2}, DType::F32, Device::cuda(0));
  Tensor sin32 = Tensor::empty({T, D / 2}, DType::F32, Device::cuda(0));
  cuda::rope_tables(cuda::to_device(pos32, 0), D, theta, bf, cos32, sin32, ctx.stream);
  EXPECT_EQ(test::device_floats(cos32), test::device_floats(cos)) << what;

  Tensor x = test::host_random({T, heads, D}, seed, 1.0f, bf);
  Tensor want = cpu::rope_forward(x, ref, bf);
  Tensor dx = test::device_from_host(x, dt);
  Tensor out = Tensor::empty(x.shape(), dt, Device::cuda(0));
  cuda::rope_forward(dx, cos, sin, out, ctx.stream);
  test::expect_near_normalised(test::device_floats(out), want.to_floats(), bf ? 4e-3 : 1e-5, bf ? 1e-3 : 1e-6,
                               what + " forward");
  cuda::rope_forward(dx, cos, sin, dx, ctx.stream);  // in place
  EXPECT_EQ(test::device_floats(dx), test::device_floats(out)) << what << " in-place forward";

  Tensor dy = test::host_random({T, heads, D}, seed + 1, 1.0f, bf);
  Tensor dwant = cpu::rope_backward(dy, ref);
  Tensor ddy = test::device_from_host(dy, dt);
  Tensor ddx = Tensor::empty(x.shape(), dt, Device::cuda(0));
  cuda::rope_backward(ddy, cos, sin, ddx, ctx.stream);
  test::expect_near_normalised(test::device_floats(ddx), dwant.to_floats(), bf ? 4e-3 : 1e-5, bf ? 3e-3 : 1e-6,
                               what + " backward");
}

TEST(CudaRope, MatchesCpuOnPackedDocuments) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 500;
  for (DType dt : {DType::BF16, DType::F32}) {
    run_case({10, 15, 12}, 0, 3, 64, 1e6, dt, seed += 10);
    run_case({37}, 0, 4, 128, 1e6, dt, seed += 10);
    run_case({5, 1, 3}, 0, 2, 6, 10000.0, dt, seed += 10);     // odd half (3)
    run_case({3, 4}, 30000, 1, 256, 1e6, dt, seed += 10);       // long-context positions
    run_case({1}, 0, 7, 2, 10000.0, dt, seed += 10);            // D = 2
  }
}

// YaRN tables (GPT-OSS: head_dim 64, theta 150000, factor 32, beta 32 / 1, original 4096, truncate false; cos and
// sin times attention_factor 0.1·ln 32 + 1 before the bf16 rounding) from the host's inverse frequencies, against
// cpu::rope_tables(positions, inv_freq, attention_factor, bf16); thresholds as above (correctly rounded cos/sin, the
// same fp32 product). Positions reach GPT-OSS's 131,072. With the default frequencies and factor 1 they are the
// theta overload's tables bit for bit.
TEST(CudaRope, YarnTablesMatchCpu) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const int64_t D = 64;
  const std::vector<float> inv = cpu::rope_yarn_inv_freq(D, 150000.0, 32.0, 32.0, 1.0, 4096, false);
  const float factor = static_cast<float>(0.1 * std::log(32.0) + 1.0);
  for (int64_t start : {int64_t{0}, int64_t{131000}}) {
    Tensor pos = doc_positions({30, 17, 25}, start);
    const int64_t T = pos.numel();
    for (bool bf : {false, true}) {
      const std::string what = std::string(bf ? "bf16" : "f32") + " start=" + std::to_string(start);
      cpu::RopeTables ref = cpu::rope_tables(pos, inv, factor, bf);
      Tensor cos = Tensor::empty({T, D / 2}, DType::F32, Device::cuda(0));
      Tensor sin = Tensor::empty({T, D / 2}, DType::F32, Device::cuda(0));
      cuda::rope_tables(cuda::to_device(pos, 0), inv, factor, bf, cos, sin, ctx.stream);
      test::expect_near_normalised(test::device_floats(cos), first_half(ref.cos), 1e-6, 1e-7, what + " yarn cos");
      test::expect_near_normalised(test::device_floats(sin), first_half(ref.sin), 1e-6, 1e-7, what + " yarn sin");
      const std::vector<float> c = test::device_floats(cos);
      EXPECT_GT(*std::max_element(c.begin(), c.end()), 1.3f) << what << ": the attention factor is missing";

      auto table = [T, D] { return Tensor::empty({T, D / 2}, DType::F32, Device::cuda(0)); };
      Tensor cos1 = table(), sin1 = table(), cos2 = table(), sin2 = table();
      cuda::rope_tables(cuda::to_device(pos, 0), cpu::rope_default_inv_freq(D, 1e6), 1.0f, bf, cos1, sin1, ctx.stream);
      cuda::rope_tables(cuda::to_device(pos, 0), D, 1e6, bf, cos2, sin2, ctx.stream);
      EXPECT_EQ(test::device_floats(cos1), test::device_floats(cos2)) << what;
      EXPECT_EQ(test::device_floats(sin1), test::device_floats(sin2)) << what;
    }
  }
  Tensor pos = cuda::to_device(doc_positions({4}, 0), 0);
  Tensor cos = Tensor::empty({4, 4}, DType::F32, Device::cuda(0));
  Tensor sin = Tensor::empty({4, 4}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::rope_tables(pos, std::vector<float>(), 1.0f, false, cos, sin, ctx.stream), Error);
  EXPECT_THROW(cuda::rope_tables(pos, std::vector<float>(8, 1.0f), 1.0f, false, cos, sin, ctx.stream), Error);
  EXPECT_THROW(cuda::rope_tables(pos, std::vector<float>(300, 1.0f), 1.0f, false, cos, sin, ctx.stream), Error);
}

TEST(CudaRope, RejectsBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  Tensor pos = cuda::to_device(doc_positions({4}, 0), 0);
  Tensor cos = Tensor::empty({4, 4}, DType::F32, Device::cuda(0)), sin = cos;
  EXPECT_THROW(cuda::rope_tables(pos, 7, 1e4, false, cos, sin, ctx.stream), Error);    // odd head_dim
  EXPECT_THROW(cuda::rope_tables(pos, 16, 1e4, false, cos, sin, ctx.stream), Error);   // table size
  Tensor x = Tensor::empty({4, 3, 6}, DType::BF16, Device::cuda(0));                   // D 6 != 8
  EXPECT_THROW(cuda::rope_forward(x, cos, sin, x, ctx.stream), Error);
}

}  // namespace
}  // namespace mt
