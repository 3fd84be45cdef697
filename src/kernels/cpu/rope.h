// Rotary position embedding, half-split (NeoX) layout as Qwen3 uses it:
//   inv_freq_i = 1 / theta^(2i/D) (fp32), freqs = inv_freq ⊗ position (fp32), emb = cat(freqs, freqs)
//   out = x·cos(emb) + rotate_half(x)·sin(emb),  rotate_half(x) = cat(-x[D/2:], x[:D/2])
#pragma once
#include <vector>

#include "core/tensor.h"

namespace mt::cpu {

struct RopeTables {
  Tensor cos;  // F32 [T, D]; bf16-rounded values in bf16 mode
  Tensor sin;  // F32 [T, D]
};

// positions I64 [T] (any shape), head_dim D even -> tables. bf16: cos/sin computed in fp32, then rounded.
RopeTables rope_tables(const Tensor& positions, int64_t head_dim, double theta, bool bf16);
// The same from given inverse frequencies [D/2], cos and sin multiplied by attention_factor (fp32) before the
// bf16 rounding (Transformers' attention_scaling; 1 leaves the default tables bit for bit).
RopeTables rope_tables(const Tensor& positions, const std::vector<float>& inv_freq, float attention_factor,
                       bool bf16);

// Transformers' inverse frequencies (modeling_rope_utils.py, hf-numerics.md §7), fp32 as it computes them:
// default 1 / theta^(2i/D); YaRN blends interpolated (÷ factor) and extrapolated frequencies over a linear ramp
// between the correction dims of beta_fast and beta_slow (floored / ceiled when truncate).
std::vector<float> rope_default_inv_freq(int64_t D, double theta);
std::vector<float> rope_yarn_inv_freq(int64_t D, double theta, double factor, double beta_fast, double beta_slow,
                                      int64_t original_max_positions, bool truncate);

// x F32 [T, heads, D] (or [T, heads*D]) -> rotated copy. bf16: rounding after every op
// (bf16(bf16(x·cos) + bf16(rotate_half(x)·sin))).
Tensor rope_forward(const Tensor& x, const RopeTables& t, bool bf16);
// dy like x -> dx (the exact transpose of the fp32 rotation).
Tensor rope_backward(const Tensor& dy, const RopeTables& t);

// DeepSeek-V3's interleaved layout (Transformers' apply_rotary_pos_emb_interleave): pairs (x_2i, x_2i+1) rotate by
// angle i, and the output is de-interleaved, evens then odds:
//   out_i = x_2i·cos_i − x_2i+1·sin_i,  out_{D/2+i} = x_2i+1·cos_i + x_2i·sin_i       (i < D/2)
// (applied alike to queries and keys, the permutation leaves every q·k unchanged). Tables as rope_tables makes
// them (cos_i = cos[i], the first half). bf16: every product and the sum rounded, as the eager ops do.
Tensor rope_interleaved_forward(const Tensor& x, const RopeTables& t, bool bf16);
// dy like the output -> dx like x (the exact transpose of the fp32 map).
Tensor rope_interleaved_backward(const Tensor& dy, const RopeTables& t);

}  // namespace mt::cpu
