// The all-gather expert dispatch's row budget (distributed/ep_row_budget.h): exact until a load is observed,
// then the largest load times the headroom, in rows of the even share rounded up, bounded by the most rows a
// micro-batch can route to the rank; headroom 0 never budgets.
#include "distributed/ep_row_budget.h"

#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"

namespace mt {
namespace {

constexpr int64_t S = EpRowBudget::kScale;

TEST(EpRowBudget, ExactUntilALoadIsObserved) {
  EpRowBudget b;
  EXPECT_EQ(b.headroom(), EpRowBudget::kDefaultHeadroom);
  EXPECT_TRUE(b.exact());
  EXPECT_EQ(b.ratio(), 0.0);
  EXPECT_THROW(b.rows(32768, 65536), Error);
  b.observe(0);  // a step without any expert rows here teaches nothing
  EXPECT_TRUE(b.exact());
}

TEST(EpRowBudget, RowsAreTheLargestLoadTimesTheHeadroom) {
  EpRowBudget b(1.25);
  b.observe(S);  // exactly the even share
  ASSERT_FALSE(b.exact());
  EXPECT_DOUBLE_EQ(b.ratio(), 1.25);
  EXPECT_EQ(b.rows(32768, 65536), 40960);  // 1.25 · 32768
  EXPECT_EQ(b.rows(3, 100), 4);            // ceil(3.75)
  EXPECT_EQ(b.rows(32768, 35000), 35000);  // never more than can arrive
  EXPECT_EQ(b.rows(0, 10), 1);             // never an empty buffer

  // A smaller load later keeps the budget; a load within the headroom of it raises it.
  b.observe(S / 2);
  EXPECT_DOUBLE_EQ(b.ratio(), 1.25);
  b.observe(S * 3 / 2);  // 1.5 · 1.25 = 1.875
  EXPECT_DOUBLE_EQ(b.ratio(), 1.875);
  EXPECT_EQ(b.rows(4096, 1 << 20), 7680);
}

TEST(EpRowBudget, RoundsUpAndDoesNotOverflowForLargeShares) {
  EpRowBudget b(1.0);
  b.observe(S + 1);  // just over the even share
  EXPECT_EQ(b.rows(S, 1 << 30), S + 1);
  EXPECT_EQ(b.rows(1, 1 << 30), 2);  // ceil((S + 1) / S)
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(b.rows(big, int64_t{1} << 50), big + big / S);
}

TEST(EpRowBudget, HeadroomBelowOneStaysUnderTheObservedLoad) {
  EpRowBudget b(0.5);
  b.observe(2 * S);
  EXPECT_DOUBLE_EQ(b.ratio(), 1.0);  // every step whose load repeats passes it: the fallback's test setting
  EXPECT_EQ(b.rows(1000, 5000), 1000);
}

TEST(EpRowBudget, HeadroomZeroAlwaysCountsOnTheHost) {
  EpRowBudget b(0.0);
  b.observe(3 * S);
  EXPECT_TRUE(b.exact());
}

TEST(EpRowBudget, BadArgumentsAreErrors) {
  EXPECT_THROW(EpRowBudget(-1.0), Error);
  EXPECT_THROW(EpRowBudget(std::numeric_limits<double>::quiet_NaN()), Error);
  EpRowBudget b;
  EXPECT_THROW(b.observe(-1), Error);
  b.observe(S);
  EXPECT_THROW(b.rows(-1, 10), Error);
}

}  // namespace
}  // namespace mt
