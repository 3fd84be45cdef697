// Schedules checked against values worked out by hand from transformers.optimization's lambdas.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "train/lr_schedule.h"

namespace mt {
namespace {

LrSchedule make(const char* name, int64_t warmup, int64_t total, double min_ratio = 0) {
  LrSchedule s;
  s.name = name;
  s.peak_lr = 2e-4;
  s.warmup_steps = warmup;
  s.total_steps = total;
  s.min_lr_ratio = min_ratio;
  return s;
}

TEST(LrSchedule, WarmupStartsAtZeroLikeLambdaLR) {
  const LrSchedule s = make("constant", 4, 10);
  EXPECT_EQ(lr_at(s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 1), 0.5e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 3), 1.5e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 4), 2e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 9), 2e-4);
}

TEST(LrSchedule, LinearDecaysToZeroOrFloor) {
  const LrSchedule s = make("linear", 2, 10);
  EXPECT_DOUBLE_EQ(lr_at(s, 2), 2e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 6), 1e-4);   // (10-6)/(10-2)
  EXPECT_DOUBLE_EQ(lr_at(s, 10), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 12), 0.0);
  const LrSchedule f = make("linear", 0, 10, 0.25);
  EXPECT_DOUBLE_EQ(lr_at(f, 9), 2e-4 * 0.25);  // 0.1 floored at 0.25
}

TEST(LrSchedule, CosineWithMinRatio) {
  const LrSchedule s = make("cosine", 2, 12);
  EXPECT_DOUBLE_EQ(lr_at(s, 2), 2e-4);
  EXPECT_NEAR(lr_at(s, 7), 1e-4, 1e-18);  // halfway
  EXPECT_NEAR(lr_at(s, 12), 0.0, 1e-18);
  EXPECT_NEAR(lr_at(s, 4), 2e-4 * 0.5 * (1 + std::cos(std::numbers::pi * 0.2)), 1e-18);
  const LrSchedule m = make("cosine", 0, 10, 0.1);
  EXPECT_NEAR(lr_at(m, 10), 2e-5, 1e-18);
  EXPECT_NEAR(lr_at(m, 5), 2e-4 * (0.1 + 0.9 * 0.5), 1e-18);
  EXPECT_NEAR(lr_at(m, 20), 2e-5, 1e-18);  // past the end: stays at the floor
}

TEST(LrSchedule, UnknownNameIsAnError) { EXPECT_THROW(lr_at(make("step", 0, 3), 1), Error); }

}  // namespace
}  // namespace mt
