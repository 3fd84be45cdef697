#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"

namespace mt {
namespace {

TEST(Rng, Deterministic) {
  Rng a(123), b(123), c(124), d(123, 1);
  std::vector<uint64_t> va, vb, vc, vd;
  for (int i = 0; i < 100; ++i) {
    va.push_back(a.next_u64());
    vb.push_back(b.next_u64());
    vc.push_back(c.next_u64());
    vd.push_back(d.next_u64());
  }
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  EXPECT_NE(va, vd);
  // Pinned values: the stream must not change between versions or machines (checkpoints and
  // tests rely on seeded init). Regenerate only on a deliberate algorithm change.
  Rng p(0);
  EXPECT_EQ(p.next_u64(), 0xfb5405f7bd79c540ull);
  EXPECT_EQ(p.next_u64(), 0x780c98e26cea5883ull);
  EXPECT_EQ(rng_stream_of(""), 0xcbf29ce484222325ull);  // FNV-1a offset basis
  EXPECT_EQ(rng_stream_of("a"), 0xaf63dc4c8601ec8cull);  // FNV-1a("a")
}

TEST(Rng, UniformMoments) {
  Rng r(9);
  const int n = 100000;
  double s = 0, s2 = 0, lo = 1, hi = 0;
  for (int i = 0; i < n; ++i) {
    double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    s += u;
    s2 += u * u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);              // sd of the mean ~ 0.0009
  EXPECT_NEAR(var, 1.0 / 12.0, 0.002);
  EXPECT_LT(lo, 1e-3);
  EXPECT_GT(hi, 1 - 1e-3);
}

TEST(Rng, NormalMoments) {
  Rng r(2024);
  const int n = 100000;
  std::vector<float> v(n);
  r.fill_normal(v.data(), n, 1.5, 2.0);
  double s = 0, s2 = 0, s4 = 0;
  int within1 = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    s += x;
  }
  const double mean = s / n;
  for (float x : v) {
    double d = x - mean;
    s2 += d * d;
    s4 += d * d * d * d;
    within1 += std::abs(d) < 2.0;
  }
  const double var = s2 / n;
  EXPECT_NEAR(mean, 1.5, 0.02);               // sd of the mean = 2/sqrt(1e5) ~ 0.0063
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.02);
  EXPECT_NEAR(s4 / n / (var * var), 3.0, 0.1);  // kurtosis of a normal
  EXPECT_NEAR(within1 / double(n), 0.6827, 0.01);
}

}  // namespace
}  // namespace mt
