#include "io/dequant.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/float_convert.h"

namespace mt {

namespace {

constexpr uint16_t kBf16QuietNan = 0x7FC0;
constexpr uint32_t kF32QuietNan = 0x7FC00000u;

void check_output(const Tensor& out, const Shape& shape, const std::string& what) {
  if (out.dtype() != DType::F32 && out.dtype() != DType::BF16)
    fail("{}: dequantised output must be F32 or BF16, not {}", what, dtype_safetensors_name(out.dtype()));
  if (out.shape() != shape)
    fail("{}: dequantised output shape {} does not match {}", what, shape_str(out.shape()), shape_str(shape));
  if (!out.device().is_cpu() || !out.present()) fail("{}: dequantised output must be a present CPU tensor", what);
}

// Writes v at element i of out (F32 or BF16): one RNE rounding for bf16, NaN made canonical (see dequant.h).
inline void store(void* out, bool bf16, int64_t i, float v) {
  if (bf16) {
    static_cast<uint16_t*>(out)[i] = std::isnan(v) ? kBf16QuietNan : float_to_bf16(v);
  } else {
    const uint32_t bits = std::isnan(v) ? kF32QuietNan : float_bits(v);
    std::memcpy(static_cast<char*>(out) + i * 4, &bits, 4);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

}  // namespace

Shape fp8_block_scale_shape(const Shape& shape, int64_t block_rows, int64_t block_cols) {
  if (shape.size() < 2) fail("FP8 block scales need a tensor of at least 2 dims, not {}", shape_str(shape));
  if (block_rows <= 0 || block_cols <= 0) fail("FP8 block size {}x{} must be positive", block_rows, block_cols);
  Shape s = shape;
  s[s.size() - 2] = ceil_div(shape[shape.size() - 2], block_rows);
  s[s.size() - 1] = ceil_div(shape[shape.size() - 1], block_cols);
  return s;
}

void dequant_fp8_block_into(const Tensor& q, const Tensor& scale_inv, int64_t block_rows, int64_t block_cols,
                            Tensor& out, const std::string& what) {
  if (q.dtype() != DType::F8_E4M3)
    fail("{}: FP8 weight must be F8_E4M3, found {}", what, dtype_safetensors_name(q.dtype()));
  if (q.ndim() < 2) fail("{}: FP8 weight must have at least 2 dims, found {}", what, shape_str(q.shape()));
  if (scale_inv.dtype() != DType::F32)
    fail("{}: weight_scale_inv must be F32, found {}", what, dtype_safetensors_name(scale_inv.dtype()));
  const Shape want = fp8_block_scale_shape(q.shape(), block_rows, block_cols);
  if (scale_inv.shape() != want)
    fail("{}: weight_scale_inv shape {} does not fit weight {} with {}x{} blocks (expected {})", what,
         shape_str(scale_inv.shape()), shape_str(q.shape()), block_rows, block_cols, shape_str(want));
  check_output(out, q.shape(), what);
  static const std::array<float, 256> lut = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = fp8_e4m3_to_float(static_cast<uint8_t>(b));
    return t;
  }();
  const int64_t R = q.dim(-2), C = q.dim(-1), SR = want[want.size() - 2], SC = want.back();
  const int64_t mats = R * C == 0 ? 0 : q.numel() / (R * C);
  const auto* qp = static_cast<const uint8_t*>(q.data());
  const auto* sp = static_cast<const char*>(scale_inv.data());  // f32, possibly mis-aligned (mmapped file)
  void* op = out.data();
  const bool bf16 = out.dtype() == DType::BF16;
#pragma omp parallel for schedule(static)
  for (int64_t mr = 0; mr < mats * R; ++mr) {
    const int64_t m = mr / R, r = mr % R;
    const char* srow = sp + ((m * SR + r / block_rows) * SC) * 4;
    const int64_t base = mr * C;
    for (int64_t c = 0; c < C; ++c) {
      float s;
      std::memcpy(&s, srow + (c / block_cols) * 4, 4);
      store(op, bf16, base + c, lut[qp[base + c]] * s);
    }
  }
}

float mxfp4_code_value(uint8_t code) {
  static constexpr std::array<float, 16> lut = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return lut[code & 0xF];
}

float e8m0_scale_value(uint8_t byte) {
  // torch.ldexp(x, e) = x · pow(2.0, e) with the power in f32: 2^-127 is a subnormal, exact; 2^128 overflows.
  return byte == 255 ? std::numeric_limits<float>::infinity() : std::ldexp(1.0f, static_cast<int>(byte) - 127);
}

void dequant_mxfp4_into(const Tensor& blocks, const Tensor& scales, Tensor& out, const std::string& what) {
  if (blocks.dtype() != DType::U8)
    fail("{}: MXFP4 blocks must be U8, found {}", what, dtype_safetensors_name(blocks.dtype()));
  if (scales.dtype() != DType::U8)
    fail("{}: MXFP4 scales must be U8, found {}", what, dtype_safetensors_name(scales.dtype()));
  if (blocks.ndim() < 2 || blocks.dim(-1) != 16)
    fail("{}: MXFP4 blocks must be [..., G, 16], found {}", what, shape_str(blocks.shape()));
  const Shape want_scales(blocks.shape().begin(), blocks.shape().end() - 1);
  if (scales.shape() != want_scales)
    fail("{}: MXFP4 scales shape {} does not match blocks {} (expected {})", what, shape_str(scales.shape()),
         shape_str(blocks.shape()), shape_str(want_scales));
  Shape want_out = want_scales;
  want_out.back() *= 32;
  check_output(out, want_out, what);
  const int64_t groups = scales.numel();
  const auto* bp = static_cast<const uint8_t*>(blocks.data());
  const auto* sp = static_cast<const uint8_t*>(scales.data());
  void* op = out.data();
  const bool bf16 = out.dtype() == DType::BF16;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = e8m0_scale_value(sp[g]);
    for (int64_t j = 0; j < 16; ++j) {
      const uint8_t b = bp[g * 16 + j];
      store(op, bf16, g * 32 + 2 * j, mxfp4_code_value(b & 0xF) * scale);  // low nibble first
      store(op, bf16, g * 32 + 2 * j + 1, mxfp4_code_value(b >> 4) * scale);
    }
  }
}

}  // namespace mt
