// Mamba2's causal depthwise conv1d over time (nn.Conv1d(C, C, K, groups=C, padding=K−1, bias) cut to the first S
// outputs, as Transformers' torch path runs it), per segment of tokens (kernels/cpu/seq_segments.h):
//   y[t, c] = Σ_{j<K} w[c, j] · x[t − (K−1) + j, c]  + b[c]        (x before the segment's start = 0)
// The taps are summed in order j = 0..K−1 in fp32, the bias added last.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/seq_segments.h"

namespace mt::cpu {

// x F32 [T, C], w F32|BF16 [C, 1, K], b F32|BF16 [C] or undefined -> y F32 [T, C]. bf16: y rounded once (the bf16
// convolution's output, bias included).
Tensor conv1d_causal_forward(const Tensor& x, const Tensor& w, const Tensor& b, const std::vector<SeqSegment>& segs,
                             bool bf16);
// dy F32 [T, C] -> dx F32 [T, C] (returned); dw F32 [C, 1, K] and db F32 [C] accumulated (nullptr or undefined:
// not computed, a frozen or absent parameter).
Tensor conv1d_causal_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const std::vector<SeqSegment>& segs,
                              Tensor* dw, Tensor* db);

}  // namespace mt::cpu
