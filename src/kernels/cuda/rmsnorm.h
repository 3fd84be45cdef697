// RMSNorm over the last dimension (Qwen3RMSNorm), also the QK-norm (rows = tokens × heads, n = head_dim).
// The activation dtype T (BF16 or F32) is that of x; w, out, the residual and the gradients dy/dx use T too.
//   BF16: out = bf16(w · bf16(x·rstd)) (HF's two roundings, hf-numerics.md §1.1), or with round_once
//   out = bf16(w · (x·rstd)) (GPT-OSS's RMSNorm: the product in fp32, one rounding; NormRounding::gpt_oss).
//   F32: out = w · x·rstd (round_once changes nothing). The backward is the same for both (fp32 on x).
//   rstd = rsqrt(mean(x²) + eps) in fp32.
// Outputs may alias inputs elementwise (out = x, sum = x or residual, dx = dy or dresidual).
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"
#include "kernels/cuda/flash_attention.h"

namespace mt::cuda {

// x [..., n], w [n] -> out [..., n]; rstd (optional, F32 [rows]) receives rsqrt(mean(x²)+eps).
void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& out, Tensor* rstd, cudaStream_t stream,
                     bool round_once = false);

// Fused residual add + norm: sum = x + residual (bf16-rounded in BF16, as HF adds two bf16 tensors),
// out = rmsnorm(sum). `sum` is the new residual stream.
void rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& w, float eps, Tensor& sum,
                              Tensor& out, Tensor* rstd, cudaStream_t stream, bool round_once = false);

// dy [..., n] -> dx (overwritten) = d(out)/d(x)ᵀ·dy (+ dresidual when given: the gradient that reached the
// residual stream directly); dw F32 [n] += Σ_rows dy ⊙ x·rstd. fp32 math on x without the bf16 roundings
// (as the CPU reference), dw summed in a fixed order (deterministic).
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, Tensor& dx, Tensor& dw,
                      const Tensor* dresidual, cudaStream_t stream);

// Attention's QK-norm then RoPE in one pass: x [T·heads, D] (rows token-major), cos/sin F32 [T, D/2] (rope.h):
// out = rope(rmsnorm(x)), bit-equal to rmsnorm_forward then rope_forward (same bf16 roundings). Fused for bf16,
// D a power of two in [16, 256] and 16-byte aligned data; otherwise it runs those two. out may alias x.
void rmsnorm_rope_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& cos, const Tensor& sin,
                          Tensor& out, cudaStream_t stream);
// dy: the gradient of rmsnorm_rope_forward's output. dx = rmsnorm_backward's dx of rope_backward(dy), dw += its
// dw, bit-equal to those two kernels (the rotated gradient rounded to bf16 as rope_backward stores it). dx may
// alias dy.
void rmsnorm_rope_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, const Tensor& cos,
                           const Tensor& sin, Tensor& dx, Tensor& dw, cudaStream_t stream);
// The same for the query heads straight from the Hopper flash backward's fp32 dQ sums (flash_attention.h; head_dim
// 128): bit-equal to flash_dq_sums_to_bf16 then rmsnorm_rope_backward, without dq's bf16 write and read (where
// the fused rows do not apply, e.g. unaligned data, it runs those two).
void rmsnorm_rope_backward_from_flash_dq(const FlashDqSums& dq, const Tensor& x, const Tensor& w, float eps,
                                         const Tensor& cos, const Tensor& sin, Tensor& dx, Tensor& dw,
                                         cudaStream_t stream);

namespace detail {
// The QK-norm + RoPE forward's rows per lane group: 1, 2 or 4 (used where it divides the head count), or 0 to let
// the shape choose (the default). For the tests (every choice gives the same bits) and the bench.
void rmsnorm_rope_rows_per_group_set(int rows);
// Whether the one-pass backward's workers prefetch their next row into L1 (default on); for the bench.
void rmsnorm_backward_prefetch_next_set(bool on);
}  // namespace detail

}  // namespace mt::cuda
