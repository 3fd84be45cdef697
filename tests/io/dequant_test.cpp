// FP8 block and MXFP4 dequantisation against values computed here from the format definitions (bit fields decoded
// in double, roundings written out independently of core/float_convert), bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "io/dequant.h"
#include "io_test_util.h"

namespace mt {
namespace {

using io_test::expect_error;

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The bf16 nearest to x (ties to even), found in double arithmetic: x = m·2^e with m in [0.5, 1); keep 8
// significant bits. Exact for every finite x here (normal bf16 range; subnormals handled by clamping e).
uint16_t bf16_nearest(double x) {
  if (std::isnan(x)) return 0x7FC0;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  x = std::fabs(x);
  if (std::isinf(x)) return sign | 0x7F80;
  if (x == 0) return sign;
  int e;
  std::frexp(x, &e);
  e = std::max(e, -125);  // below 2^-126 the spacing stays that of the subnormals, 2^-133
  const double ulp = std::ldexp(1.0, e - 8);
  double k = std::floor(x / ulp);
  const double frac = x / ulp - k;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(k, 2.0) == 1.0)) k += 1;
  const float r = static_cast<float>(k * ulp);  // exact: 8 significant bits
  if (std::isinf(r) || k * ulp >= 0x1p128) return sign | 0x7F80;
  return sign | static_cast<uint16_t>(f32_bits(r) >> 16);
}

// e4m3fn decoded from its bit fields: bias 7, subnormals m/8·2^-6, S.1111.111 is NaN, no infinity.
double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

// e2m1 decoded from its bit fields: bias 1, subnormal m·0.5, no infinity or NaN.
double e2m1_value(uint8_t c) {
  const int e = (c >> 1) & 3, m = c & 1;
  const double mag = e == 0 ? m * 0.5 : (1 + m / 2.0) * std::ldexp(1.0, e - 1);
  return (c & 8) ? -mag : mag;
}

Tensor bytes_tensor(const Shape& shape, DType dt, const std::vector<uint8_t>& b) {
  Tensor t = Tensor::empty(shape, dt);
  EXPECT_EQ(t.nbytes(), b.size());
  std::memcpy(t.data(), b.data(), b.size());
  return t;
}

uint16_t bf16_at(const Tensor& t, int64_t i) { return t.data_as<uint16_t>()[i]; }

TEST(DequantMxfp4, EveryCodeAtEveryExponentIsHfExact) {
  // One group per scale byte 0..255; group g holds every code in both nibbles: byte j = (15 - j) << 4 | j, so value
  // 2j is code j (low nibble first) and 2j+1 is code 15 - j.
  const int64_t G = 256;
  std::vector<uint8_t> blocks(G * 16), scales(G);
  for (int64_t g = 0; g < G; ++g) {
    scales[g] = static_cast<uint8_t>(g);
    for (int j = 0; j < 16; ++j) blocks[g * 16 + j] = static_cast<uint8_t>(((15 - j) << 4) | j);
  }
  Tensor bl = bytes_tensor({2, G / 2, 16}, DType::U8, blocks), sc = bytes_tensor({2, G / 2}, DType::U8, scales);
  Tensor out16 = Tensor::empty({2, G / 2 * 32}, DType::BF16), out32 = Tensor::empty({2, G / 2 * 32}, DType::F32);
  dequant_mxfp4_into(bl, sc, out16, "t");
  dequant_mxfp4_into(bl, sc, out32, "t");
  int nan = 0, inf = 0, negzero = 0;
  for (int64_t g = 0; g < G; ++g)
    for (int i = 0; i < 32; ++i) {
      const uint8_t code = static_cast<uint8_t>(i % 2 == 0 ? i / 2 : 15 - i / 2);
      // HF: lut value · 2^(s-127) with the power in f32, where 2^128 (s = 255) is +inf; so 0·inf is NaN and any
      // |value| >= 2^128 is inf.
      const double v = e2m1_value(code), p = g == 255 ? INFINITY : std::ldexp(1.0, static_cast<int>(g) - 127);
      double want = v * p;
      if (std::isfinite(want) && std::fabs(want) >= 0x1p128) want = std::copysign(INFINITY, want);
      const uint16_t w16 = bf16_nearest(want);
      const int64_t k = g * 32 + i;
      EXPECT_EQ(bf16_at(out16, k), w16) << "scale " << g << " code " << int(code);
      const float f = out32.data_as<float>()[k];
      if (std::isnan(want)) {
        ++nan;
        EXPECT_EQ(f32_bits(f), 0x7FC00000u);
        EXPECT_EQ(bf16_at(out16, k), 0x7FC0);
      } else {
        EXPECT_EQ(f32_bits(f), f32_bits(static_cast<float>(want))) << "scale " << g << " code " << int(code);
        // Every finite value has <= 2 significant bits: exact in bf16.
        EXPECT_EQ(static_cast<uint32_t>(w16) << 16, f32_bits(f)) << "scale " << g << " code " << int(code);
        inf += std::isinf(want);
        negzero += want == 0 && std::signbit(want);
      }
    }
  // Each code appears twice per group. NaN: +0 and -0 times 2^128.
  EXPECT_EQ(nan, 2 * 2);
  // |v| >= 2^128 overflows: at scale 253 (2^126) |v| >= 4 (codes 6, 7, 14, 15), at 254 (2^127) |v| >= 2 (codes
  // 4..7, 12..15); at scale 255 (inf) the 14 nonzero codes.
  EXPECT_EQ(inf, 2 * (4 + 8 + 14));
  EXPECT_EQ(negzero, 2 * 255);  // code 8 at every finite scale keeps its sign
  // Spot values: scale 127 is 2^0, code 7 = 6, code 9 = -0.5; scale 0 with code 1: 0.5·2^-127 = 2^-128 (a bf16
  // subnormal, 0x0020).
  EXPECT_EQ(bf16_at(out16, 127 * 32 + 14), 0x40C0);  // 6.0
  EXPECT_EQ(bf16_at(out16, 127 * 32 + 13), 0xBF00);  // code 15-6 = 9: -0.5
  EXPECT_EQ(bf16_at(out16, 0 * 32 + 2), 0x0020);     // code 1 at scale 0
}

TEST(DequantMxfp4, LowNibbleFirstAndScalePerGroup) {
  // Two groups: 0x21 → values (code 1, code 2) = (0.5, 1.0); scales 128 (×2) and 126 (×0.5).
  std::vector<uint8_t> blocks(32, 0);
  blocks[0] = 0x21;
  blocks[16] = 0xF7;  // (code 7, code 15) = (6, -6)
  Tensor out = Tensor::empty({64}, DType::BF16);
  dequant_mxfp4_into(bytes_tensor({2, 16}, DType::U8, blocks), bytes_tensor({2}, DType::U8, {128, 126}), out, "t");
  EXPECT_EQ(bf16_at(out, 0), 0x3F80);   // 0.5·2 = 1
  EXPECT_EQ(bf16_at(out, 1), 0x4000);   // 1·2 = 2
  EXPECT_EQ(bf16_at(out, 2), 0x0000);   // code 0
  EXPECT_EQ(bf16_at(out, 32), 0x4040);  // 6·0.5 = 3
  EXPECT_EQ(bf16_at(out, 33), 0xC040);  // -3
}

TEST(DequantFp8, EveryCodeTimesScaleRoundsLikeHf) {
  // All 256 codes in a 2x128 weight, one 128x128 block with scale 3: q·3 has <= 6 significant bits, exact in f32
  // and bf16, so the result is the decoded value times 3.
  std::vector<uint8_t> q(256);
  for (int i = 0; i < 256; ++i) q[i] = static_cast<uint8_t>(i);
  Tensor qt = bytes_tensor({2, 128}, DType::F8_E4M3, q);
  Tensor s = Tensor::from_floats({1, 1}, {3.0f});
  Tensor out = Tensor::empty({2, 128}, DType::BF16);
  dequant_fp8_block_into(qt, s, 128, 128, out, "t");
  int nan = 0;
  for (int i = 0; i < 256; ++i) {
    const double want = e4m3_value(static_cast<uint8_t>(i)) * 3.0;
    if (std::isnan(want)) {
      ++nan;
      EXPECT_EQ(bf16_at(out, i), 0x7FC0) << i;
      continue;
    }
    EXPECT_EQ(bf16_at(out, i), bf16_nearest(static_cast<float>(want))) << "code " << i;
  }
  EXPECT_EQ(nan, 2);                   // 0x7F and 0xFF
  EXPECT_EQ(bf16_at(out, 0x80), 0x8000);  // -0 · 3 = -0
  EXPECT_EQ(bf16_at(out, 0x7E), 0x44A8);  // 448 · 3 = 1344
  EXPECT_EQ(bf16_at(out, 0x01), 0x3BC0);  // 2^-9 · 3
}

TEST(DequantFp8, RoundsTwiceThroughF32AsHfDoes) {
  // q = 1.125 (0x39), s = 0x3FD15555: the exact product needs 28 bits. HF rounds it to f32 (the multiply), then to
  // bf16 (the cast): that lands on a bf16 tie and goes to even, while one rounding of the exact product goes the
  // other way. Both outcomes computed here; the dequantiser must give the first.
  const float s = [] {
    uint32_t u = 0x3FD15555u;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }();
  const double exact = 1.125 * static_cast<double>(s);
  const uint16_t twice = bf16_nearest(static_cast<float>(exact)), once = bf16_nearest(exact);
  ASSERT_NE(twice, once);
  Tensor out = Tensor::empty({1, 1}, DType::BF16);
  dequant_fp8_block_into(bytes_tensor({1, 1}, DType::F8_E4M3, {0x39}), Tensor::from_floats({1, 1}, {s}), 128, 128,
                         out, "t");
  EXPECT_EQ(bf16_at(out, 0), twice);
  EXPECT_EQ(twice, 0x3FEC);
  // F32 output: the f32 product, one rounding.
  Tensor out32 = Tensor::empty({1, 1}, DType::F32);
  dequant_fp8_block_into(bytes_tensor({1, 1}, DType::F8_E4M3, {0x39}), Tensor::from_floats({1, 1}, {s}), 128, 128,
                         out32, "t");
  EXPECT_EQ(f32_bits(out32.data_as<float>()[0]), f32_bits(static_cast<float>(exact)));
}

TEST(DequantFp8, PartialEdgeBlocksUseCeilScales) {
  // 5x3 weight, 2x2 blocks: scales [3, 2]; element (i, j) uses scale (i/2, j/2); the last row and column are
  // partial blocks. Every q = 1.0 (0x38), so the output is the scale map itself.
  std::vector<uint8_t> q(15, 0x38);
  std::vector<float> sv = {1, 2, 4, 8, 16, 32};
  Tensor out = Tensor::empty({5, 3}, DType::F32);
  dequant_fp8_block_into(bytes_tensor({5, 3}, DType::F8_E4M3, q), Tensor::from_floats({3, 2}, sv), 2, 2, out, "t");
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(out.data_as<float>()[i * 3 + j], sv[(i / 2) * 2 + j / 2]) << i << "," << j;
  EXPECT_EQ(fp8_block_scale_shape({576, 7168}, 128, 128), (Shape{5, 56}));  // DeepSeek-V3 kv_a_proj_with_mqa
  // A scale of inf or NaN propagates as IEEE multiplication does; 0 · inf is NaN.
  Tensor o2 = Tensor::empty({1, 2}, DType::BF16);
  dequant_fp8_block_into(bytes_tensor({1, 2}, DType::F8_E4M3, {0x38, 0x00}),
                         Tensor::from_floats({1, 1}, {std::numeric_limits<float>::infinity()}), 128, 128, o2, "t");
  EXPECT_EQ(bf16_at(o2, 0), 0x7F80);
  EXPECT_EQ(bf16_at(o2, 1), 0x7FC0);
}

TEST(DequantFp8, LeadingDimsAreSeparateMatrices) {
  // [2, 1, 2] weight with one block per matrix: matrix 0 scaled by 2, matrix 1 by -1.
  Tensor out = Tensor::empty({2, 1, 2}, DType::F32);
  dequant_fp8_block_into(bytes_tensor({2, 1, 2}, DType::F8_E4M3, {0x38, 0x40, 0x38, 0x40}),
                         Tensor::from_floats({2, 1, 1}, {2.0f, -1.0f}), 128, 128, out, "t");
  EXPECT_EQ(out.to_floats(), (std::vector<float>{2, 4, -1, -2}));
}

TEST(DequantErrors, OneLineNamingTheTensor) {
  Tensor q = bytes_tensor({2, 2}, DType::F8_E4M3, {0, 0, 0, 0});
  Tensor out = Tensor::empty({2, 2}, DType::BF16);
  expect_error([&] { dequant_fp8_block_into(q, Tensor::from_floats({1, 2}, {1, 1}), 128, 128, out, "f: w"); },
               {"f: w", "weight_scale_inv shape [1, 2]", "expected [1, 1]"});
  expect_error([&] { dequant_fp8_block_into(q, Tensor::from_floats({1, 1}, {1}, DType::BF16), 128, 128, out, "f: w"); },
               {"f: w", "must be F32", "BF16"});
  expect_error([&] { dequant_fp8_block_into(out, Tensor::from_floats({1, 1}, {1}), 128, 128, out, "f: w"); },
               {"f: w", "F8_E4M3", "BF16"});
  expect_error([&] { dequant_fp8_block_into(q, Tensor::from_floats({1, 1}, {1}), 0, 128, out, "f: w"); },
               {"block size 0x128"});
  Tensor wrong = Tensor::empty({2, 3}, DType::BF16);
  expect_error([&] { dequant_fp8_block_into(q, Tensor::from_floats({1, 1}, {1}), 128, 128, wrong, "f: w"); },
               {"f: w", "output shape [2, 3]"});
  Tensor bl = bytes_tensor({1, 16}, DType::U8, std::vector<uint8_t>(16, 0));
  Tensor o32 = Tensor::empty({32}, DType::BF16);
  expect_error([&] { dequant_mxfp4_into(bl, bytes_tensor({2}, DType::U8, {0, 0}), o32, "f: b"); },
               {"f: b", "scales shape [2]", "expected [1]"});
  expect_error([&] { dequant_mxfp4_into(bytes_tensor({2, 8}, DType::U8, std::vector<uint8_t>(16, 0)),
                                        bytes_tensor({2}, DType::U8, {0, 0}), o32, "f: b"); },
               {"f: b", "[..., G, 16]"});
  expect_error([&] { dequant_mxfp4_into(bl, Tensor::from_floats({1}, {1}), o32, "f: b"); }, {"scales must be U8"});
}

}  // namespace
}  // namespace mt
