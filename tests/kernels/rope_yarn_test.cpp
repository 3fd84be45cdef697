// YaRN RoPE (hf-numerics.md §7) against the formula in double, and the attention factor on the tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/float_convert.h"
#include "kernels/cpu/rope.h"

namespace mt {
namespace {

std::vector<double> naive_yarn(int D, double base, double factor, double bf, double bs, double orig, bool truncate) {
  auto corr = [&](double r) { return D * std::log(orig / (r * 2 * M_PI)) / (2 * std::log(base)); };
  double low = corr(bf), high = corr(bs);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, D - 1.0);
  if (low == high) high += 0.001;
  std::vector<double> f(D / 2);
  for (int i = 0; i < D / 2; ++i) {
    const double pos = std::pow(base, 2.0 * i / D);
    const double extra = 1 - std::clamp((i - low) / (high - low), 0.0, 1.0);
    f[i] = 1 / (factor * pos) * (1 - extra) + 1 / pos * extra;
  }
  return f;
}

TEST(CpuRopeYarn, InverseFrequenciesFollowTransformers) {
  struct Case {
    int D;
    double base, factor, bf, bs;
    int orig;
    bool truncate;
  };
  // GPT-OSS (no truncation), a DeepSeek-like one (truncated), and one whose whole range ramps.
  for (const Case& c : {Case{64, 150000, 32, 32, 1, 4096, false}, Case{64, 10000, 40, 32, 1, 4096, true},
                        Case{16, 150000, 32, 32, 1, 4096, false}, Case{8, 10000, 4, 2, 1, 64, true}}) {
    const auto got = cpu::rope_yarn_inv_freq(c.D, c.base, c.factor, c.bf, c.bs, c.orig, c.truncate);
    const auto want = naive_yarn(c.D, c.base, c.factor, c.bf, c.bs, c.orig, c.truncate);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 4e-7 * want[i]) << "D " << c.D << " i " << i;
    // The fastest frequency is extrapolated (kept), the slowest interpolated (÷ factor).
    EXPECT_NEAR(got.front(), 1.0, 1e-7);
    EXPECT_NEAR(got.back(), want.back(), 4e-7 * want.back());
  }
  // factor 1 leaves the default frequencies.
  const auto y = cpu::rope_yarn_inv_freq(32, 10000, 1.0, 32, 1, 4096, true), d = cpu::rope_default_inv_freq(32, 10000);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], d[i], 1e-7 * d[i]);
}

TEST(CpuRopeYarn, AttentionFactorScalesCosAndSinBeforeRounding) {
  Tensor pos = Tensor::empty({3}, DType::I64);
  for (int i = 0; i < 3; ++i) pos.data_as<int64_t>()[i] = 5 * i + 1;
  const auto f = cpu::rope_default_inv_freq(8, 10000);
  const float af = static_cast<float>(0.1 * std::log(32.0) + 1.0);
  const auto plain = cpu::rope_tables(pos, f, 1.0f, false), scaled = cpu::rope_tables(pos, f, af, false),
             scaled16 = cpu::rope_tables(pos, f, af, true);
  const auto c1 = plain.cos.to_floats(), c2 = scaled.cos.to_floats(), c3 = scaled16.cos.to_floats();
  const auto s1 = plain.sin.to_floats(), s2 = scaled.sin.to_floats();
  for (size_t i = 0; i < c1.size(); ++i) {
    EXPECT_EQ(c2[i], c1[i] * af);
    EXPECT_EQ(s2[i], s1[i] * af);
    EXPECT_EQ(c3[i], round_bf16(c1[i] * af));
  }
  // The theta overload is the default frequencies at factor 1, bit for bit.
  EXPECT_EQ(cpu::rope_tables(pos, 8, 10000, true).cos.to_floats(), cpu::rope_tables(pos, f, 1.0f, true).cos.to_floats());
}

}  // namespace
}  // namespace mt
