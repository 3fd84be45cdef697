// Row gather / scatter by an index list (the LM head's rows with a target) against host loops: exact
// copies, for 16-byte rows (bf16 [T, 2048]), 4-byte units (f32 [T, 3]) and 1-byte units (bf16 [T, 1]),
// an empty list, and the shape checks.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/row_select.h"

namespace mt {
namespace {

// Every third row and then some: distinct, increasing, as the batch builds them.
std::vector<int32_t> some_rows(int64_t T, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> rows;
  for (int64_t t = 0; t < T; ++t)
    if (g() % 3 != 0) rows.push_back(static_cast<int32_t>(t));
  return rows;
}

Tensor device_rows(const std::vector<int32_t>& rows) {
  Tensor h = Tensor::empty({static_cast<int64_t>(rows.size())}, DType::I32);
  for (size_t i = 0; i < rows.size(); ++i) h.data_as<int32_t>()[i] = rows[i];
  return cuda::to_device(h, 0);
}

void run_case(int64_t T, int64_t C, DType dt, uint64_t seed) {
  SCOPED_TRACE("T " + std::to_string(T) + " C " + std::to_string(C) + (dt == DType::BF16 ? " bf16" : " f32"));
  auto& ctx = cuda::device_context(0);
  const std::vector<int32_t> rows = some_rows(T, seed);
  const int64_t R = static_cast<int64_t>(rows.size());
  const Tensor src = test::host_random({T, C}, seed + 1, 1.0f, dt == DType::BF16);
  const std::vector<float> s = src.to_floats();

  Tensor part = Tensor::empty({R, C}, dt, Device::cuda(0));
  cuda::rows_gather(test::device_from_host(src, dt), device_rows(rows), part, ctx.stream);
  const std::vector<float> got = test::device_floats(part);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(got[i * C + c], s[rows[i] * C + c]) << "gathered row " << i << " column " << c;

  // Scatter back into a buffer full of 7s: the listed rows come back, every other row is zero.
  Tensor full = test::device_from_host(Tensor::from_floats({T, C}, std::vector<float>(T * C, 7.0f)), dt);
  cuda::rows_scatter(part, device_rows(rows), full, ctx.stream);
  const std::vector<float> back = test::device_floats(full);
  std::vector<char> listed(T, 0);
  for (int32_t r : rows) listed[r] = 1;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(back[t * C + c], listed[t] ? s[t * C + c] : 0.0f) << "row " << t << " column " << c;
}

TEST(CudaRowSelect, GatherAndScatterAreExactCopies) {
  MT_SKIP_WITHOUT_CUDA();
  run_case(300, 2048, DType::BF16, 1);  // 16-byte units
  run_case(129, 3, DType::F32, 2);      // 4-byte units
  run_case(77, 1, DType::BF16, 3);      // 2-byte rows: byte units
}

TEST(CudaRowSelect, EmptyListGathersNothingAndScattersZeros) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  Tensor none = cuda::to_device(Tensor::empty({0}, DType::I32), 0);
  Tensor src = test::device_from_host(test::host_random({5, 8}, 4), DType::F32);
  Tensor part = Tensor::empty({0, 8}, DType::F32, Device::cuda(0));
  cuda::rows_gather(src, none, part, ctx.stream);
  cuda::rows_scatter(part, none, src, ctx.stream);
  for (float v : test::device_floats(src)) ASSERT_EQ(v, 0.0f);
}

TEST(CudaRowSelect, MismatchedShapesAreErrors) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  Tensor rows = device_rows({0, 2});
  Tensor src = Tensor::empty({4, 8}, DType::BF16, Device::cuda(0));
  Tensor wrong_width = Tensor::empty({2, 4}, DType::BF16, Device::cuda(0));
  Tensor wrong_dtype = Tensor::empty({2, 8}, DType::F32, Device::cuda(0));
  Tensor too_many = Tensor::empty({6, 8}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::rows_gather(src, rows, wrong_width, ctx.stream), Error);
  EXPECT_THROW(cuda::rows_gather(src, rows, wrong_dtype, ctx.stream), Error);
  EXPECT_THROW(cuda::rows_scatter(too_many, device_rows({0, 1, 2, 3, 0, 1}), src, ctx.stream), Error);
}

}  // namespace
}  // namespace mt
