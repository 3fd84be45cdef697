#include "distributed/ep_row_budget.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt {

EpRowBudget::EpRowBudget(double headroom) : headroom_(headroom) {
  MT_CHECK(std::isfinite(headroom) && headroom >= 0, "expert row headroom {} (0 or a positive number)", headroom);
}

int64_t EpRowBudget::rows(int64_t share, int64_t most) const {
  MT_CHECK(!exact(), "expert row budget: no budget yet");
  MT_CHECK(share >= 0 && most >= 0, "expert row budget: share {} and most {} rows", share, most);
  // ceil(budget · share / kScale) without overflow for any share a device buffer can have
  const int64_t whole = share / kScale, part = share % kScale;
  const int64_t want = whole * budget_ + (part * budget_ + kScale - 1) / kScale;
  return std::max<int64_t>(std::min(want, most), 1);
}

void EpRowBudget::observe(int64_t load) {
  MT_CHECK(load >= 0, "expert row budget: negative load {}", load);
  if (headroom_ == 0 || load == 0) return;
  const auto want = static_cast<int64_t>(std::ceil(static_cast<double>(load) * headroom_));
  budget_ = std::max(budget_, std::max<int64_t>(want, 1));
}

}  // namespace mt
