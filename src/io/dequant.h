// Load-only decoders of the quantised checkpoint formats Transformers dequantises on load (hf-numerics.md §8.5,
// §8.6). They live in io/ because they decode storage formats, like the safetensors reader: no model knowledge,
// CPU only, run once per tensor at load. The values are exactly those Transformers 5.17 produces:
//  * FP8 e4m3fn with block scales: W[i, j] = f32(q[i, j]) · scale_inv[i / bm, j / bn], one f32 multiply, then one
//    RNE rounding to the output dtype (HF multiplies in the scale's dtype, f32, and casts to the model dtype after).
//    Blocks are counted with ceil, so the last block of a dimension may be partial (kv_a_proj_with_mqa: 576 rows).
//  * MXFP4 (OCP microscaling, e2m1 values, one E8M0 scale per 32 values): byte b of a 16-byte block gives values
//    2j = LUT[b & 0xF] (low nibble first) and 2j+1 = LUT[b >> 4], times 2^(scale − 127) in f32. Every finite result
//    has at most 2 significant bits, so it is exact in bf16 and f32; |v| ≥ 2^128 (scale 254 with |v| ≥ 2, 255 with
//    v ≠ 0) overflows to ±inf, and scale byte 255 (E8M0's NaN) gives 2^128 = inf in torch's f32 pow, so ±0 there
//    becomes NaN (0 · inf) — what HF computes, not the OCP NaN rule.
// NaN outputs are written as the canonical quiet NaN (bf16 0x7FC0, f32 0x7FC00000): torch's NaN bit pattern
// depends on the code path (CPU scalar 0x7FC0, CPU vectorised 0xFFFF, CUDA 0x7FFF), so only NaN-ness is defined.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace mt {

// q: F8_E4M3 [..., R, C]; scale_inv: F32 [..., ceil(R/block_rows), ceil(C/block_cols)]; out: F32 or BF16, shape of
// q (a view into a parameter is fine). Throws mt::Error naming `what` on a dtype or shape mismatch.
void dequant_fp8_block_into(const Tensor& q, const Tensor& scale_inv, int64_t block_rows, int64_t block_cols,
                            Tensor& out, const std::string& what);

// The scale shape FP8 block quantisation stores for a weight of `shape` ([..., R, C]); throws if shape has < 2 dims.
Shape fp8_block_scale_shape(const Shape& shape, int64_t block_rows, int64_t block_cols);

// blocks: U8 [..., G, 16]; scales: U8 [..., G]; out: F32 or BF16 [..., G·32], in the blocks' orientation (HF
// transposes the last two dims afterwards). Throws mt::Error naming `what` on a dtype or shape mismatch.
void dequant_mxfp4_into(const Tensor& blocks, const Tensor& scales, Tensor& out, const std::string& what);

// The value of one e2m1 code (0..15) and of one E8M0 scale byte as HF multiplies them (2^(b−127) in f32: byte 255
// is +inf). Exposed for the tests.
float mxfp4_code_value(uint8_t code);
float e8m0_scale_value(uint8_t byte);

}  // namespace mt
