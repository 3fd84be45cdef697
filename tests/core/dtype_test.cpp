#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "core/float_convert.h"
#include "core/memory.h"
#include "core/tensor.h"

namespace mt {

TEST(DType, NamesRoundTrip) {
  EXPECT_EQ(dtype_from_safetensors_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_from_safetensors_name("F8_E4M3"), DType::F8_E4M3);
  EXPECT_FALSE(dtype_from_safetensors_name("bf16").has_value());
  EXPECT_EQ(dtype_from_torch_name("torch.bfloat16"), DType::BF16);
  EXPECT_EQ(dtype_from_torch_name("float32"), DType::F32);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  // Serialization order used by the safetensors writer.
  EXPECT_LT(DType::BF16, DType::F32);
  EXPECT_LT(DType::F16, DType::BF16);
  EXPECT_LT(DType::U8, DType::BF16);
}

TEST(FloatConvert, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between bf16 1.0 and 1.0078125: ties to even -> 1.0
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is half way between 1.0078125 (odd) and 1.015625 (even) -> up
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.0f)), -3.0f);
}

TEST(FloatConvert, F16AndFp8) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);
  EXPECT_FLOAT_EQ(f16_to_float(0x0001), 5.9604645e-8f);
  EXPECT_EQ(f16_to_float(float_to_f16(0.1f)), 0.0999755859375f);
  EXPECT_FLOAT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_FLOAT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_FLOAT_EQ(fp8_e5m2_to_float(0x3c), 1.0f);
  EXPECT_FLOAT_EQ(fp8_e8m0_to_float(127), 1.0f);
  EXPECT_FLOAT_EQ(fp8_e8m0_to_float(130), 8.0f);
}

TEST(Tensor, ViewsShareStorageAndMemoryIsCounted) {
  const int64_t before = memory_stats(Device::cpu()).current_bytes;
  {
    Tensor t = Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6});
    EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before + 24);
    Tensor r = t.rows(1, 2);
    EXPECT_EQ(r.shape(), (Shape{1, 3}));
    EXPECT_EQ(r.to_floats(), (std::vector<float>{4, 5, 6}));
    Tensor b = t.to(DType::BF16);
    EXPECT_EQ(b.nbytes(), 12u);
    EXPECT_EQ(b.to_floats(), t.to_floats());
    EXPECT_GE(memory_stats(Device::cpu()).peak_bytes, before + 36);
  }
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before);
}

}  // namespace mt
