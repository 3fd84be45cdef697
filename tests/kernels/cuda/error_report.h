// expect_near_normalised (cuda_test_util.h) that also prints the measured errors when the environment
// sets MT_PRINT_ERRORS, so the thresholds in each test can be checked against what the GPU gives.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace mt::test {

inline void expect_norm(const std::vector<float>& got, const std::vector<float>& want, double max_norm_tol,
                        double rel_l2_tol, const std::string& what) {
  expect_near_normalised(got, want, max_norm_tol, rel_l2_tol, what);
  if (std::getenv("MT_PRINT_ERRORS")) {
    const ErrorStats s = error_stats(got, want);
    std::printf("[ error    ] %s: max-norm %.3g (limit %.3g), rel-L2 %.3g (limit %.3g)\n", what.c_str(), s.max_norm,
                max_norm_tol, s.rel_l2, rel_l2_tol);
  }
}

}  // namespace mt::test
