#include "models/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace mt {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_no_nan(const float* logits, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(logits[i])) fail("generate: the model produced a NaN logit (token {})", i);
}

void check_finite(const float* logits, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(logits[i])) fail("generate: the model produced a non-finite logit {} (token {})", logits[i], i);
}

}  // namespace

void sampling_options_check(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    fail("--temperature must be a finite number >= 0 (0 = greedy), found {}", o.temperature);
  if (!(o.top_p > 0 && o.top_p <= 1)) fail("--top-p must be in (0, 1], found {}", o.top_p);
  if (o.top_k < 0) fail("--top-k must be >= 0 (0 = off), found {}", o.top_k);
}

int64_t sample_argmax(const float* logits, int64_t n) {
  MT_CHECK(n >= 1, "argmax over {} logits", n);
  check_no_nan(logits, n);
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

std::vector<float> sampling_warp_logits(const float* logits, int64_t n, const SamplingOptions& o) {
  sampling_options_check(o);
  MT_CHECK(o.temperature > 0 && n >= 1, "warping {} logits at temperature {}", n, o.temperature);
  std::vector<float> s(logits, logits + n);
  if (o.temperature != 1.0) {
    const float t = static_cast<float>(o.temperature);
    for (float& x : s) x = x / t;
    for (float x : s)
      if (x == -kNegInf) fail("--temperature {} is too small: logits / temperature overflow fp32 (0 = greedy)", o.temperature);
  }
  if (o.top_k > 0 && o.top_k < n) {
    std::vector<float> sorted(s);
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[o.top_k - 1];
    for (float& x : s)
      if (x < kth) x = kNegInf;
  }
  if (o.top_p < 1.0) {
    // Ascending order; among equal scores the higher index comes first, so it is dropped first.
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return s[a] < s[b] || (s[a] == s[b] && a > b);
    });
    const float m = s[order.back()];
    double sum = 0;
    for (float x : s) sum += std::exp(static_cast<double>(x) - m);
    const float inv = static_cast<float>(1.0 / sum);
    const float threshold = static_cast<float>(1.0 - o.top_p);  // torch compares the fp32 cumsum with it
    float cum = 0;
    for (int64_t r = 0; r + 1 < n; ++r) {  // the largest score is always kept
      const int64_t i = order[r];
      cum += std::exp(s[i] - m) * inv;
      if (cum <= threshold) s[i] = kNegInf;
    }
  }
  return s;
}

int64_t sample_token(const float* logits, int64_t n, const SamplingOptions& o, Rng& rng) {
  if (o.temperature == 0) return sample_argmax(logits, n);
  check_finite(logits, n);
  const std::vector<float> s = sampling_warp_logits(logits, n, o);
  const float m = *std::max_element(s.begin(), s.end());
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += p[i] = s[i] == kNegInf ? 0.0 : std::exp(static_cast<double>(s[i]) - m);
  const double u = rng.uniform() * sum;
  double cum = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] == 0) continue;
    cum += p[i];
    last = i;
    if (u < cum) return i;
  }
  MT_CHECK(last >= 0, "no token left to sample from {} logits", n);
  return last;  // u rounded up to the total
}

}  // namespace mt
