// Tensor allocation refuses shapes whose size cannot be counted, instead of allocating a wrapped-around size.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace mt {
namespace {

std::string empty_error(const Shape& shape, DType dtype) {
  try {
    Tensor::empty(shape, dtype);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorShape, SizesThatOverflowAreErrors) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(empty_error({2, big}, DType::I64), "shape [2, 9223372036854775807] has more elements than an int64 counts");
  // 2^61 elements fit an int64, their 8-byte size does not fit a size_t.
  EXPECT_EQ(empty_error({int64_t{1} << 61}, DType::I64),
            "shape [2305843009213693952] of int64 needs more bytes than a size_t counts");
  EXPECT_EQ(empty_error({3, -1}, DType::F32), "negative dimension in shape [3, -1]");
  EXPECT_THROW(Tensor::absent({2, big, 2}, DType::F32), Error);  // a tensor another rank holds is checked too
}

TEST(TensorShape, ZeroAndOrdinarySizesAllocate) {
  EXPECT_EQ(Tensor::empty({0, std::numeric_limits<int64_t>::max()}, DType::F32).nbytes(), 0u);
  const Tensor t = Tensor::zeros({3, 5}, DType::BF16);
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_EQ(t.numel(), 15);
}

}  // namespace
}  // namespace mt
