// Next-token sampling on hand-built distributions: the exact token sets top-k and top-p keep (in HF's
// order: temperature, top-k, top-p), greedy argmax, reproducible seeded draws with the right frequencies.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"
#include "models/sampling.h"

namespace mt {
namespace {

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

std::set<int64_t> kept(const std::vector<float>& logits, double temperature, int64_t top_k, double top_p) {
  SamplingOptions o{temperature, top_p, top_k};
  const auto w = sampling_warp_logits(logits.data(), static_cast<int64_t>(logits.size()), o);
  std::set<int64_t> s;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] == -std::numeric_limits<float>::infinity()) continue;
    s.insert(static_cast<int64_t>(i));
    EXPECT_EQ(w[i], logits[i] / static_cast<float>(temperature)) << "kept scores are the tempered logits";
  }
  return s;
}

std::string error_of(const SamplingOptions& o) {
  try {
    sampling_options_check(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Sampling, TopKKeepsEveryScoreAtLeastTheKthLargest) {
  const std::vector<float> z = {1, 5, 3, 5, 2, 4};
  EXPECT_EQ(kept(z, 1, 3, 1), (std::set<int64_t>{1, 3, 5}));
  EXPECT_EQ(kept(z, 1, 2, 1), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(kept(z, 1, 1, 1), (std::set<int64_t>{1, 3}));  // the tie at the k-th value stays (scores < kth go)
  EXPECT_EQ(kept(z, 1, 0, 1), (std::set<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(kept(z, 1, 6, 1), (std::set<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(kept(z, 1, 50, 1), (std::set<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(kept({1, 3, 3, 3, 0}, 1, 2, 1), (std::set<int64_t>{1, 2, 3}));
}

TEST(Sampling, TopPKeepsTheSmallestTopSetReachingP) {
  const auto z = log_probs({0.1, 0.4, 0.2, 0.3});
  // Ascending 0.1 0.2 0.3 0.4, cumulative 0.1 0.3 0.6 1.0; drop where cumulative <= 1 − p.
  EXPECT_EQ(kept(z, 1, 0, 0.6), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(kept(z, 1, 0, 0.75), (std::set<int64_t>{1, 2, 3}));
  EXPECT_EQ(kept(z, 1, 0, 0.95), (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(kept(z, 1, 0, 0.35), (std::set<int64_t>{1}));
  EXPECT_EQ(kept(z, 1, 0, 1e-9), (std::set<int64_t>{1}));  // at least one token
  // Equal scores: the higher index is dropped first, so the lowest survives.
  EXPECT_EQ(kept(log_probs({0.25, 0.25, 0.25, 0.25}), 1, 0, 0.3), (std::set<int64_t>{0, 1}));
  EXPECT_EQ(kept(log_probs({0.25, 0.25, 0.25, 0.25}), 1, 0, 0.1), (std::set<int64_t>{0}));
}

TEST(Sampling, WarpersRunInHfOrderTemperatureTopKTopP) {
  const auto z = log_probs({0.1, 0.4, 0.2, 0.3});
  // top-k first: {1, 3} renormalised to 4/7, 3/7; top-p 0.5 then drops 3/7 <= 0.5. (top-p first would keep {1, 3}.)
  EXPECT_EQ(kept(z, 1, 2, 0.5), (std::set<int64_t>{1}));
  EXPECT_EQ(kept(z, 1, 0, 0.5), (std::set<int64_t>{1, 3}));
  // Temperature before top-p: T = 0.5 squares the probabilities (0.033 0.533 0.133 0.3): 0.533 alone reaches 0.5.
  EXPECT_EQ(kept(z, 0.5, 0, 0.5), (std::set<int64_t>{1}));
  // T = 2 flattens them (0.163 0.325 0.230 0.282): cumulative 0.163 0.393 0.675 1 -> {1, 3} at p = 0.5, all at 0.7.
  EXPECT_EQ(kept(z, 2, 0, 0.5), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(kept(z, 2, 0, 0.7), (std::set<int64_t>{1, 2, 3}));
  EXPECT_EQ(kept(z, 1, 0, 0.7 - 0.05), (std::set<int64_t>{1, 3}));
}

TEST(Sampling, TemperatureZeroIsArgmaxLowestIndexOnTies) {
  Rng rng(1);
  SamplingOptions greedy{0, 1, 0};
  const std::vector<float> z = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sample_argmax(z.data(), 4), 1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sample_token(z.data(), 4, greedy, rng), 1);
  // Greedy ignores top-k / top-p, as generate() with do_sample=False does.
  greedy.top_k = 3;
  greedy.top_p = 0.1;
  EXPECT_EQ(sample_token(z.data(), 4, greedy, rng), 1);
  const std::vector<float> bad = {0.5f, std::nanf(""), 1.0f};
  EXPECT_THROW(sample_argmax(bad.data(), 3), Error);
  SamplingOptions t1;
  EXPECT_THROW(sample_token(bad.data(), 3, t1, rng), Error);
}

TEST(Sampling, DrawsFollowTheWarpedDistributionAndTheSeed) {
  const auto z = log_probs({0.1, 0.4, 0.2, 0.3});
  auto freq = [&](const SamplingOptions& o, uint64_t seed, int n) {
    Rng rng(seed);
    std::vector<double> f(4, 0.0);
    for (int i = 0; i < n; ++i) f[sample_token(z.data(), 4, o, rng)] += 1.0 / n;
    return f;
  };
  const int n = 40000;  // binomial standard deviation <= 0.0025
  auto f = freq({1, 1, 0}, 3, n);
  const double want[] = {0.1, 0.4, 0.2, 0.3};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], want[i], 0.012) << i;
  f = freq({1, 1, 2}, 4, n);  // top-k 2: 4/7 and 3/7
  EXPECT_EQ(f[0], 0.0);
  EXPECT_EQ(f[2], 0.0);
  EXPECT_NEAR(f[1], 4.0 / 7, 0.012);
  EXPECT_NEAR(f[3], 3.0 / 7, 0.012);
  f = freq({0.5, 1, 0}, 5, n);  // T = 0.5: p² / Σp² = 1/30, 16/30, 4/30, 9/30
  EXPECT_NEAR(f[0], 1.0 / 30, 0.012);
  EXPECT_NEAR(f[1], 16.0 / 30, 0.012);
  EXPECT_NEAR(f[3], 9.0 / 30, 0.012);

  // Same seed, same draws; another seed, other draws.
  auto draws = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int64_t> d;
    for (int i = 0; i < 64; ++i) d.push_back(sample_token(z.data(), 4, SamplingOptions{}, rng));
    return d;
  };
  EXPECT_EQ(draws(9), draws(9));
  EXPECT_NE(draws(9), draws(10));
}

TEST(Sampling, OptionErrorsNameTheOption) {
  EXPECT_EQ(error_of({-0.5, 1, 0}), "--temperature must be a finite number >= 0 (0 = greedy), found -0.5");
  EXPECT_EQ(error_of({std::nan(""), 1, 0}), "--temperature must be a finite number >= 0 (0 = greedy), found nan");
  EXPECT_EQ(error_of({1, 0, 0}), "--top-p must be in (0, 1], found 0");
  EXPECT_EQ(error_of({1, 1.5, 0}), "--top-p must be in (0, 1], found 1.5");
  EXPECT_EQ(error_of({1, std::nan(""), 0}), "--top-p must be in (0, 1], found nan");
  EXPECT_EQ(error_of({1, 1, -2}), "--top-k must be >= 0 (0 = off), found -2");
  EXPECT_EQ(error_of({0, 1, 0}), "(no error)");
  const std::vector<float> z = {1.0f, 2.0f};
  Rng rng(1);
  try {
    sample_token(z.data(), 2, {1e-45, 1, 0}, rng);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--temperature"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt
