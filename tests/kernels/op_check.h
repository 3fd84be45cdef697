// Test helpers for the CPU ops: seeded random data, comparisons against double-precision naive
// references, and central finite differences of those references.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt::test {

inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

inline Tensor f32(const Shape& s, const std::vector<float>& v) { return Tensor::from_floats(s, v); }

// max |got − want| ≤ atol + rtol · max |want|
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0, worst = 0.0;
  size_t at = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << " NaN at " << i;
    const double e = std::fabs(got[i] - want[i]);
    if (e > worst) worst = e, at = i;
  }
  EXPECT_LE(worst, atol + rtol * scale) << what << ": worst at " << at << " got " << got[at] << " want "
                                        << want[at] << " (scale " << scale << ")";
}

// d f / d x by central differences in double.
inline std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f,
                                        std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace mt::test
