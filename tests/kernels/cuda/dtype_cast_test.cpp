// BF16 <-> F32 on the device against the host's conversion (core/float_convert.h): BF16 -> F32 is exact, F32 -> BF16
// rounds to nearest even, as round_bf16 does, so both directions are compared bit for bit; plus the shape check.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/dtype_cast.h"

namespace mt {
namespace {

TEST(CudaDtypeCast, MatchesTheHostConversionBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  // Values with bits below bf16's precision (ties included: 1 + 2^-8 rounds to even), signs, zeros, tiny numbers.
  std::vector<float> v = test::cuda_random_floats(1001, 7, 3.0f);
  v[0] = 1.0f + 1.0f / 256.0f, v[1] = 1.0f + 3.0f / 256.0f, v[2] = -0.0f, v[3] = 1e-40f, v[4] = 65504.0f;
  const Tensor host = Tensor::from_floats({1001}, v);
  const Tensor src = test::device_from_host(host, DType::F32);
  Tensor b = Tensor::empty({1001}, DType::BF16, Device::cuda(0));
  cuda::cast_async(src, b, ctx.stream);
  Tensor back = Tensor::empty({1001}, DType::F32, Device::cuda(0));
  cuda::cast_async(b, back, ctx.stream);
  const std::vector<float> got_b = test::device_floats(b), got_back = test::device_floats(back);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(float_bits(got_b[i]), float_bits(round_bf16(v[i]))) << i;
    EXPECT_EQ(float_bits(got_back[i]), float_bits(round_bf16(v[i]))) << i;
  }
}

TEST(CudaDtypeCast, RefusesMismatchedSizes) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Tensor a = Tensor::empty({4}, DType::F32, Device::cuda(0));
  Tensor b = Tensor::empty({5}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::cast_async(a, b, ctx.stream), Error);
}

}  // namespace
}  // namespace mt
