// Scalar conversions between float32 and the 16/8-bit float formats.
// bf16 and f16 rounding is round-to-nearest-even, as PyTorch does on the CPU and GPU.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mt {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }
// Round a float to the nearest bf16 value and return it as float: the "bf16(x)" of hf-numerics.md.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);
float fp8_e4m3_to_float(uint8_t v);  // e4m3fn: no infinities, 0x7f/0xff are NaN
float fp8_e5m2_to_float(uint8_t v);
float fp8_e8m0_to_float(uint8_t v);  // power-of-two scale, 0xff is NaN

}  // namespace mt
