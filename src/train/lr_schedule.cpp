#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace mt {

double lr_at(const LrSchedule& s, int64_t completed) {
  if (completed < s.warmup_steps)
    return s.peak_lr * static_cast<double>(completed) / static_cast<double>(std::max<int64_t>(1, s.warmup_steps));
  const double span = static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
  const double done = static_cast<double>(completed - s.warmup_steps);
  const double floor = s.min_lr_ratio;
  if (s.name == "constant") return s.peak_lr;
  if (s.name == "linear") {
    const double f = std::max(0.0, (span - done) / span);
    return s.peak_lr * std::max(floor, f);
  }
  if (s.name == "cosine") {
    const double progress = std::min(1.0, done / span);
    const double f = std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
    return s.peak_lr * (floor + (1.0 - floor) * f);
  }
  fail("schedule.name: '{}' is not a schedule (valid: constant, linear, cosine)", s.name);
}

}  // namespace mt
