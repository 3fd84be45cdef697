#include "core/float_convert.h"

#include <limits>

namespace mt {

uint16_t float_to_f16(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf (RNE boundary 65520)
  if (mag < 0x38800000u) {                                               // subnormal or zero in f16
    // value = mag as float; f16 subnormal unit is 2^-24
    float v = bits_float(mag);
    float scaled = v * 16777216.0f;  // 2^24, exact
    float r = std::nearbyint(scaled);  // default rounding mode is RNE
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t exp = ((mag >> 23) - 112u) << 10;
  uint32_t mant = (mag >> 13) & 0x3ffu;
  uint32_t h = exp | mant;
  uint32_t rest = mag & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_float(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

float fp8_e4m3_to_float(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float r;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0)
    r = std::ldexp(static_cast<float>(mant) / 8.0f, -6);
  else
    r = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  return neg ? -r : r;
}

float fp8_e5m2_to_float(uint8_t v) {
  // e5m2 is the top byte of an f16.
  return f16_to_float(static_cast<uint16_t>(v) << 8);
}

float fp8_e8m0_to_float(uint8_t v) {
  if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

}  // namespace mt
