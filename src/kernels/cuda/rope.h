// Rotary position embedding, half-split (NeoX) layout as Qwen3 uses it (same math as kernels/cpu/rope.h):
//   inv_freq_i = 1 / theta^(2i/D) (fp32, computed on the host exactly as the CPU reference and HF do),
//   f = inv_freq_i · position (fp32), out = x·cos(f) + rotate_half(x)·sin(f).
// Positions come per token, so packed documents restart them (the data loader's job).
#pragma once
#include <cuda_runtime_api.h>

#include <vector>

#include "core/tensor.h"

namespace mt::cuda {

constexpr int64_t kRopeMaxHeadDim = 512;

// positions I64 or I32 [T] -> cos, sin F32 [T, D/2] (cos(emb) = cat(cos, cos), so half is enough).
// bf16: the values are rounded to bf16 (HF casts the tables to the model dtype). D even, <= 512.
void rope_tables(const Tensor& positions, int64_t head_dim, double theta, bool bf16, Tensor& cos, Tensor& sin,
                 cudaStream_t stream);

// The same from given inverse frequencies [D/2] (YaRN's, computed on the host by cpu::rope_yarn_inv_freq), cos and
// sin multiplied by attention_factor in fp32 before the bf16 rounding, as cpu::rope_tables(positions, inv_freq,
// attention_factor, bf16) (GPT-OSS: ≈ 1.34657). attention_factor 1 gives the tables above bit for bit.
void rope_tables(const Tensor& positions, const std::vector<float>& inv_freq, float attention_factor, bool bf16,
                 Tensor& cos, Tensor& sin, cudaStream_t stream);

// x [T, heads, D] (any shape of T·heads·D elements, BF16 or F32) -> out, same dtype; out may be x.
// BF16: bf16(bf16(x·cos) + bf16(rotate_half(x)·sin)), HF's per-op rounding.
void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out, cudaStream_t stream);
// dy like x -> dx (the exact transpose of the rotation, fp32 math, rounded once to the dtype); dx may be dy.
void rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin, Tensor& dx, cudaStream_t stream);

}  // namespace mt::cuda
