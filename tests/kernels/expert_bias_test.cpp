// DeepSeek-V3's auxiliary-loss-free bias update (kernels/cpu/expert_bias.h) on hand-made count vectors, written out by
// hand from the rule bias_e += γ · sign(mean_load − load_e): exact values (±γ in fp32, or nothing), sign(0) = 0, a
// non-integer mean, and the balance metric max/mean.
#include "kernels/cpu/expert_bias.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace mt {
namespace {

Tensor ints(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  for (size_t i = 0; i < v.size(); ++i) t.data_as<int32_t>()[i] = v[i];
  return t;
}

std::vector<float> floats(const Tensor& t) { return t.to_floats(); }

TEST(ExpertBias, UpdateRuleOnAHandMadeCountVector) {
  // E 8, 32 slots: mean 4. Expert 2 and 5 sit exactly at the mean (sign 0: unchanged), 0/1/7 above (−γ), the rest
  // below (+γ).
  const Tensor load = ints({9, 5, 4, 0, 3, 4, 2, 5});
  Tensor bias = Tensor::from_floats({8}, {0.5f, -0.25f, 0.125f, 0.0f, -1.0f, 3.0f, 0.75f, -0.5f});
  const double rate = 0.001;
  const float g = 0.001f;  // γ as fp32, added in fp32
  cpu::expert_bias_update(load, bias, rate);
  EXPECT_EQ(floats(bias), (std::vector<float>{0.5f - g, -0.25f - g, 0.125f, 0.0f + g, -1.0f + g, 3.0f, 0.75f + g,
                                              -0.5f - g}));
  // The metric: max 9 over mean 4.
  EXPECT_DOUBLE_EQ(cpu::expert_load_max_over_mean(load), 9.0 / 4.0);
}

TEST(ExpertBias, NonIntegerMeanAndSignZero) {
  // Σ 10 over E 3: mean 3.333…; no expert is at the mean, so every one moves. sign(Σ − E·load) on integers:
  // 10 − 9 = 1 (+γ), 10 − 12 = −2 (−γ), 10 − 9 = 1 (+γ).
  const Tensor load = ints({3, 4, 3});
  Tensor bias = Tensor::zeros({3}, DType::F32);
  cpu::expert_bias_update(load, bias, 0.5);
  EXPECT_EQ(floats(bias), (std::vector<float>{0.5f, -0.5f, 0.5f}));
  // Every expert at the mean (perfect balance), or no slot at all: nothing moves.
  for (const std::vector<int32_t>& even : {std::vector<int32_t>{7, 7, 7, 7}, std::vector<int32_t>{0, 0, 0, 0}}) {
    Tensor b = Tensor::from_floats({4}, {1.0f, -2.0f, 0.0f, -0.0f});
    cpu::expert_bias_update(ints(even), b, 0.25);
    EXPECT_EQ(floats(b), (std::vector<float>{1.0f, -2.0f, 0.0f, -0.0f}));
    EXPECT_TRUE(std::signbit(b.to_floats()[3]));  // untouched, not +0
  }
  EXPECT_DOUBLE_EQ(cpu::expert_load_max_over_mean(ints({7, 7, 7, 7})), 1.0);
  EXPECT_DOUBLE_EQ(cpu::expert_load_max_over_mean(ints({0, 0, 0, 0})), 0.0);
  // γ = 0 (Transformers' behaviour): the bits stay.
  Tensor b = Tensor::from_floats({3}, {0.1f, 0.2f, 0.3f});
  cpu::expert_bias_update(ints({0, 0, 9}), b, 0.0);
  EXPECT_EQ(floats(b), (std::vector<float>{0.1f, 0.2f, 0.3f}));
}

TEST(ExpertBias, FloatAccumulationIsPlainFp32) {
  // 1000 steps of +γ on one expert, as an fp32 buffer accumulates them (rounded each step), not 1000·γ.
  Tensor bias = Tensor::zeros({2}, DType::F32);
  float want = 0.0f;
  for (int i = 0; i < 1000; ++i) {
    cpu::expert_bias_update(ints({0, 4}), bias, 1e-3);
    want += 1e-3f;
  }
  EXPECT_EQ(bias.to_floats()[0], want);
  EXPECT_EQ(bias.to_floats()[1], -want);
  // Large counts: the sign is taken on int64 (E · load may pass int32).
  const int32_t big = 2000000000;
  Tensor b2 = Tensor::zeros({3}, DType::F32);
  cpu::expert_bias_update(ints({big, big, big - 1}), b2, 1.0);
  EXPECT_EQ(b2.to_floats(), (std::vector<float>{-1.0f, -1.0f, 1.0f}));
}

TEST(ExpertBias, RefusesMalformedInputs) {
  Tensor bias = Tensor::zeros({4}, DType::F32);
  EXPECT_THROW(cpu::expert_bias_update(ints({1, 2, 3}), bias, 0.1), Error);                 // E mismatch
  EXPECT_THROW(cpu::expert_bias_update(ints({1, -2, 3, 4}), bias, 0.1), Error);             // negative count
  EXPECT_THROW(cpu::expert_bias_update(ints({1, 2, 3, 4}), bias, -0.1), Error);             // negative rate
  EXPECT_THROW(cpu::expert_bias_update(ints({1, 2, 3, 4}), bias, std::nan("")), Error);     // NaN rate
  Tensor bf16 = Tensor::zeros({4}, DType::BF16);
  EXPECT_THROW(cpu::expert_bias_update(ints({1, 2, 3, 4}), bf16, 0.1), Error);              // not the fp32 buffer
  EXPECT_THROW(cpu::expert_load_max_over_mean(Tensor::zeros({4}, DType::F32)), Error);      // not counts
}

}  // namespace
}  // namespace mt
