// Helpers for the differential CUDA tests: skip without a GPU, seeded random tensors, and
// normalised-error comparison of a CUDA result against the CPU reference:
//   max-norm error = max|a − b| / max(max|b|, tiny)      (worst element, relative to the data's scale)
//   rel-L2 error   = ‖a − b‖₂ / max(‖b‖₂, tiny)           (average agreement)
// bf16 has an 8-bit significand (unit roundoff 2^-9 ≈ 2e-3), so one rounding of a value differs
// from the reference by up to ~0.4% of its magnitude; thresholds in each test say how many
// roundings (or which accumulation) they allow.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/float_convert.h"
#include "core/tensor.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"

namespace mt::test {

inline bool cuda_available() {
  static const bool ok = mt::cuda::device_count() > 0;
  return ok;
}

// Put at the top of a test that needs a GPU: it is reported as skipped (not passed) without one.
#define MT_SKIP_WITHOUT_CUDA()                                     \
  do {                                                             \
    if (!::mt::test::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

inline std::vector<float> cuda_random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Random F32 host tensor (normal, std `scale`); with bf16_values every element is bf16-representable,
// so the same numbers can be uploaded as BF16 without changing them.
inline Tensor host_random(const Shape& shape, uint64_t seed, float scale = 1.0f, bool bf16_values = false) {
  std::vector<float> v = cuda_random_floats(static_cast<size_t>(shape_numel(shape)), seed, scale);
  if (bf16_values)
    for (auto& x : v) x = round_bf16(x);
  return Tensor::from_floats(shape, v);
}

// Host tensor (any float dtype) -> device tensor of dtype `dt` (converted on the host first).
inline Tensor device_from_host(const Tensor& host, DType dt) {
  return mt::cuda::to_device(host.dtype() == dt ? host : host.to(dt), 0);
}

// Device tensor -> its elements as floats on the host (waits for the device).
inline std::vector<float> device_floats(const Tensor& dev) { return mt::cuda::to_host(dev).to_floats(); }

struct ErrorStats {
  double max_abs = 0.0;   // max |a − b|
  double ref_max = 0.0;   // max |b|
  double max_norm = 0.0;  // max_abs / max(ref_max, tiny)
  double rel_l2 = 0.0;    // ‖a − b‖ / max(‖b‖, tiny)
  size_t worst = 0;       // index of max_abs
  size_t non_finite = 0;  // elements of a that are NaN/Inf where b is finite
};

inline ErrorStats error_stats(const std::vector<float>& got, const std::vector<float>& want) {
  constexpr double kTiny = 1e-30;
  ErrorStats s;
  double diff2 = 0.0, ref2 = 0.0;
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    const double a = got[i], b = want[i];
    if (!std::isfinite(a) && std::isfinite(b)) {
      s.non_finite++;
      continue;
    }
    const double d = std::fabs(a - b);
    if (d > s.max_abs) s.max_abs = d, s.worst = i;
    s.ref_max = std::max(s.ref_max, std::fabs(b));
    diff2 += d * d;
    ref2 += b * b;
  }
  s.max_norm = s.max_abs / std::max(s.ref_max, kTiny);
  s.rel_l2 = std::sqrt(diff2) / std::max(std::sqrt(ref2), kTiny);
  return s;
}

// EXPECTs that `got` (CUDA) matches `want` (CPU reference) within the normalised thresholds.
inline void expect_near_normalised(const std::vector<float>& got, const std::vector<float>& want, double max_norm_tol,
                                   double rel_l2_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what << ": element count";
  const ErrorStats s = error_stats(got, want);
  EXPECT_EQ(s.non_finite, 0u) << what << ": " << s.non_finite << " non-finite values where the reference is finite";
  EXPECT_LE(s.max_norm, max_norm_tol) << what << ": max-norm error " << s.max_norm << " > " << max_norm_tol
                                      << " (worst at " << s.worst << ": got " << (s.worst < got.size() ? got[s.worst] : 0)
                                      << " want " << (s.worst < want.size() ? want[s.worst] : 0) << ", max|ref| "
                                      << s.ref_max << ")";
  EXPECT_LE(s.rel_l2, rel_l2_tol) << what << ": rel-L2 error " << s.rel_l2 << " > " << rel_l2_tol;
}

}  // namespace mt::test
