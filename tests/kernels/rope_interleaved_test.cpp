// DeepSeek-V3's interleaved RoPE (Transformers' apply_rotary_pos_emb_interleave, hf-numerics.md §5.2): against the
// formula in double, as the half-split rotation of the de-interleaved input (bit for bit, fp32 and bf16), and its
// backward as the exact transpose (central differences of the double formula).
#include <gtest/gtest.h>

#include <cmath>

#include "core/float_convert.h"
#include "kernels/cpu/rope.h"
#include "op_check.h"

namespace mt {
namespace {

struct Case {
  int64_t T = 5, heads = 3, D = 8;
};

cpu::RopeTables tables(const Case& c, bool bf16) {
  Tensor pos = Tensor::empty({c.T}, DType::I64);
  for (int64_t i = 0; i < c.T; ++i) pos.data_as<int64_t>()[i] = 3 * i + (i % 2);
  const auto f = cpu::rope_yarn_inv_freq(c.D, 10000, 40, 32, 1, 4096, true);
  return cpu::rope_tables(pos, f, 1.0f, bf16);
}

// HF: z1 = x[..., 0::2], z2 = x[..., 1::2], out = cat(z1·c − z2·s, z2·c + z1·s), c = cos[..., :D/2].
std::vector<double> naive(const std::vector<double>& x, const cpu::RopeTables& t, const Case& c) {
  const auto cs = t.cos.to_floats(), sn = t.sin.to_floats();
  const int64_t half = c.D / 2;
  std::vector<double> out(x.size());
  for (int64_t p = 0; p < c.T; ++p)
    for (int64_t h = 0; h < c.heads; ++h) {
      const double* xr = x.data() + (p * c.heads + h) * c.D;
      double* o = out.data() + (p * c.heads + h) * c.D;
      for (int64_t i = 0; i < half; ++i) {
        const double cv = cs[p * c.D + i], sv = sn[p * c.D + i];
        o[i] = xr[2 * i] * cv - xr[2 * i + 1] * sv;
        o[half + i] = xr[2 * i + 1] * cv + xr[2 * i] * sv;
      }
    }
  return out;
}

TEST(CpuRopeInterleaved, ForwardFollowsTransformers) {
  const Case c;
  const auto t = tables(c, false);
  const auto x = test::random_floats(c.T * c.heads * c.D, 1);
  const Tensor out = cpu::rope_interleaved_forward(test::f32({c.T, c.heads, c.D}, x), t, false);
  test::expect_close(out.to_floats(), naive(test::to_double(x), t, c), 1e-6, 1e-7, "interleaved rope");
}

// Interleaved = the half split of the de-interleaved input (evens, then odds), exactly, in fp32 and in bf16: the two
// formulas do the same roundings (a + (−b) is a − b).
TEST(CpuRopeInterleaved, EqualsTheHalfSplitOfTheDeinterleavedInput) {
  const Case c;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16);
    const auto t = tables(c, bf16);
    auto x = test::random_floats(c.T * c.heads * c.D, 2);
    if (bf16)
      for (float& v : x) v = round_bf16(v);
    std::vector<float> deint(x.size());
    for (int64_t r = 0; r < c.T * c.heads; ++r)
      for (int64_t i = 0; i < c.D / 2; ++i) {
        deint[r * c.D + i] = x[r * c.D + 2 * i];
        deint[r * c.D + c.D / 2 + i] = x[r * c.D + 2 * i + 1];
      }
    const Tensor a = cpu::rope_interleaved_forward(test::f32({c.T, c.heads, c.D}, x), t, bf16);
    const Tensor b = cpu::rope_forward(test::f32({c.T, c.heads, c.D}, deint), t, bf16);
    EXPECT_EQ(a.to_floats(), b.to_floats());
    if (bf16)
      for (float v : a.to_floats()) ASSERT_EQ(v, round_bf16(v));
  }
}

TEST(CpuRopeInterleaved, BackwardIsTheTranspose) {
  const Case c;
  const auto t = tables(c, false);
  const auto x = test::to_double(test::random_floats(c.T * c.heads * c.D, 3));
  const auto dy = test::random_floats(x.size(), 4);
  const Tensor dx = cpu::rope_interleaved_backward(test::f32({c.T, c.heads, c.D}, dy), t);
  const auto want = test::numeric_grad(
      [&](const std::vector<double>& v) { return test::dot(naive(v, t, c), test::to_double(dy)); }, x);
  test::expect_close(dx.to_floats(), want, 1e-5, 1e-6, "interleaved rope backward");
}

}  // namespace
}  // namespace mt
