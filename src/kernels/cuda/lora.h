// LoRA on the GPU (CPU twin: kernels/cpu/lora.h, PEFT's lora.Linear math): y = base(x) + s·(x·Aᵀ)·Bᵀ on a dense
// linear slot through cuBLASLt, and on an expert stack (A [E, r, in], B [E, out, r]) through the grouped expert
// GEMMs (kernels/cuda/grouped_gemm.h) over the expert-contiguous rows, one launch per GEMM for every expert.
//
// The adapter's masters are fp32 (as PEFT's); the GEMMs read bf16 working copies made from them after each
// optimizer step (lora_working_copy): A' = bf16(A) and B' = bf16(s·B), the scale folded into B' so that the
// forward and the input gradient need no extra pass. Rounding points against the CPU's fp32 adapter (one bf16
// rounding has relative error u = 2^-8):
//   forward   u = bf16(x·A'ᵀ) [T, r] (kept for the backward: r values per row); dense y = bf16(y + u·B'ᵀ) in the
//             GEMM's epilogue (y holds the base output, already rounded as PEFT's bf16 base layer rounds it, so the
//             sum is rounded once more as PEFT's `result + lora_B(lora_A(x)) * scaling` then `.to(bf16)` is); an
//             expert stack writes d = bf16(u·B'ᵀ) first, then y = bf16(y + d): one rounding more.
//   backward  du = bf16(dy·B') = s·dy·B; dA += duᵀ·x and dB += s·dyᵀ·u accumulate in fp32; dx = bf16(dx + du·A')
//             (PEFT adds the adapter's input gradient, cast to bf16, to the base layer's in bf16: the same).
// So the adapter's contribution carries up to ~4u relative error (A', B', u, d) on top of the roundings the CPU
// bf16 path has; tests/kernels/cuda/lora_test.cpp turns that into per-element bounds.
// Shapes need r % 8 == 0 on the grouped path (the grouped GEMMs' 16-byte rows); the dense path takes any r.
// Every call is asynchronous on `stream`; bf16 activations, fp32 gradients.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

// One adapted weight's working copies (BF16 on the device) and its scale.
struct LoraOperands {
  const Tensor* a = nullptr;  // A' = bf16(A): [r, in], or [E, r, in] for an expert stack
  const Tensor* b = nullptr;  // B' = bf16(s·B): [out, r], or [E, out, r]
  float scale = 0.0f;         // s (dB = s·dyᵀ·u)
  bool on() const { return a != nullptr; }
  int64_t rank() const;  // r
};

// Its gradients: F32, shaped like A and B, accumulated (the caller zeroes them once per optimizer step).
struct LoraGrads {
  Tensor* a = nullptr;
  Tensor* b = nullptr;
};

// a16 = bf16(a), b16 = bf16(scale·b) (round to nearest even); a, b F32 masters, a16/b16 BF16 of the same shapes.
void lora_working_copy(const Tensor& a, const Tensor& b, float scale, Tensor& a16, Tensor& b16, cudaStream_t stream);

// ---- Dense slots (cuBLASLt) ----
// x BF16 [T, in] with row stride ldx; y BF16 [T, out] with row stride ldy holds the base output and gets
// y = bf16(y + u·B'ᵀ). Returns u = bf16(x·A'ᵀ), BF16 [T, r] (what the backward reads).
Tensor lora_forward_strided(int device, cudaStream_t stream, int64_t T, const void* x, int64_t ldx,
                            const LoraOperands& l, void* y, int64_t ldy);
// dy BF16 [T, out] (row stride lddy), x and u as in the forward: dB += s·dyᵀ·u, dA += duᵀ·x with du = bf16(dy·B'),
// and dx BF16 [T, in] (row stride lddx; holding the base layer's input gradient) = bf16(dx + du·A').
void lora_backward_strided(int device, cudaStream_t stream, int64_t T, const void* dy, int64_t lddy, const void* x,
                           int64_t ldx, const Tensor& u, const LoraOperands& l, void* dx, int64_t lddx,
                           const LoraGrads& g);
// The same on contiguous [T, ·] tensors.
Tensor lora_forward(const Tensor& x, const LoraOperands& l, Tensor& y, cudaStream_t stream);
void lora_backward(const Tensor& dy, const Tensor& x, const Tensor& u, const LoraOperands& l, Tensor& dx,
                   const LoraGrads& g, cudaStream_t stream);

// ---- Expert stacks (grouped GEMMs over the expert-contiguous layout; offsets I32 [E + 1] on the device) ----
// x BF16 [N, in]; y BF16 [N, out] (the base grouped GEMM's output) gets y = bf16(y + bf16(u_e·B'_eᵀ)) on the rows
// [0, offsets[E]) of each expert e. Returns u BF16 [N, r], u_e = bf16(x_e·A'_eᵀ). An expert without rows is
// skipped (its gradients get nothing).
Tensor lora_grouped_forward(const Tensor& x, const Tensor& offsets, const LoraOperands& l, Tensor& y,
                            cudaStream_t stream);
// dy BF16 [N, out]: dA_e += du_eᵀ·x_e (du = bf16(dy_e·B'_e)), dB_e += dy_eᵀ·bf16(s·u_e), and dx BF16 [N, in] (the
// base dgrad's output) = bf16(dx + bf16(du_e·A'_e)).
void lora_grouped_backward(const Tensor& dy, const Tensor& x, const Tensor& u, const Tensor& offsets,
                           const LoraOperands& l, Tensor& dx, const LoraGrads& g, cudaStream_t stream);

// y BF16 [N, C] = bf16(y + scale·d), d BF16 [N, C], on the rows [0, min(N, *rows_end)) (rows_end I32 on the
// device, e.g. &offsets[E]; null: every row). The grouped adapter's add; exposed for its test.
void lora_add_rows(Tensor& y, const Tensor& d, float scale, const int32_t* rows_end, cudaStream_t stream);

}  // namespace mt::cuda
