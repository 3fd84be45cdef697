// Rotary position embedding, half-split (NeoX) layout as Qwen3 uses it:
//   inv_freq_i = 1 / theta^(2i/D) (fp32), freqs = inv_freq ⊗ position (fp32), emb = cat(freqs, freqs)
//   out = x·cos(emb) + rotate_half(x)·sin(emb),  rotate_half(x) = cat(-x[D/2:], x[:D/2])
#pragma once
#include "core/tensor.h"

namespace mt::cpu {

struct RopeTables {
  Tensor cos;  // F32 [T, D]; bf16-rounded values in bf16 mode
  Tensor sin;  // F32 [T, D]
};

// positions I64 [T] (any shape), head_dim D even -> tables. bf16: cos/sin computed in fp32, then rounded.
RopeTables rope_tables(const Tensor& positions, int64_t head_dim, double theta, bool bf16);

// x F32 [T, heads, D] (or [T, heads*D]) -> rotated copy. bf16: rounding after every op
// (bf16(bf16(x·cos) + bf16(rotate_half(x)·sin))).
Tensor rope_forward(const Tensor& x, const RopeTables& t, bool bf16);
// dy like x -> dx (the exact transpose of the fp32 rotation).
Tensor rope_backward(const Tensor& dy, const RopeTables& t);

}  // namespace mt::cpu
