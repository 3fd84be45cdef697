// LoRA on a linear map (PEFT's lora.Linear, hf: peft/tuners/lora/layer.py Linear.forward):
//   y = base(x) + s·((x·Aᵀ)·Bᵀ)      A [r, in], B [out, r], s = alpha / r (alpha / √r with rsLoRA)
// The adapter runs in fp32 (PEFT's default autocast_adapter_dtype keeps adapters fp32 under a bf16 base):
// u = x·Aᵀ and d = u·Bᵀ are fp32 GEMMs, s·d is one fp32 multiply, and the sum with the base output is fp32;
// with a bf16 base that sum is rounded once to bf16 (PEFT: `result + lora_B(lora_A(x)) * scaling`, then
// `.to(bf16)`). Backward (fp32): g = s·dy; dB += gᵀ·u; du = g·B; dA += duᵀ·x; dx += du·A. The base weight
// W + s·B·A is never formed.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::cpu {

// One adapter pair, read-only: A F32 [r, in], B F32 [out, r] (or, for an expert stack, [E, r, in] and
// [E, out, r]: expert e's pair is row e of each). a == nullptr: no adapter.
struct LoraRef {
  const Tensor* a = nullptr;
  const Tensor* b = nullptr;
  float scale = 0.0f;
  bool on() const { return a != nullptr; }
};
// Its gradients, F32 and shaped like A and B, accumulated.
struct LoraGradRef {
  Tensor* a = nullptr;
  Tensor* b = nullptr;
};

// Row-level forms, shared by the linear layers and the grouped experts (one expert's rows at a time).
// y[n, out] (leading dimension ldy) += s·((x[n, in]·Aᵀ)·Bᵀ), A [r, in], B [out, r] contiguous.
void lora_forward_rows(int64_t n, int64_t in, int64_t out, int64_t r, const float* x, int64_t ldx, const float* a,
                       const float* b, float scale, float* y, int64_t ldy);
// dy[n, out]: dA [r, in] += duᵀ·x and dB [out, r] += (s·dy)ᵀ·(x·Aᵀ); dx[n, in] (when non-null) += du·A.
void lora_backward_rows(int64_t n, int64_t in, int64_t out, int64_t r, const float* x, int64_t ldx, const float* dy,
                        int64_t lddy, const float* a, const float* b, float scale, float* dx, int64_t lddx, float* da,
                        float* db);

// nn.Linear with an adapter: x F32 [..., in], w F32|BF16 [out, in], bias F32|BF16 [out] or undefined -> F32
// [..., out]. Without an adapter this is linear_forward. bf16: the base output is rounded as linear_forward
// rounds it, the sum with the adapter's output rounded once more.
Tensor lora_linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const LoraRef& lora, bool bf16);
// dy F32 [N, out], x F32 [N, in]. dx (if non-null): overwritten with dy·W + (s·dy·B)·A. dw (if non-null): += dyᵀ·x
// (null for a frozen base weight: that GEMM is skipped). The adapter's gradients go to `dlora` (both set when
// lora.on()).
void lora_linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const LoraRef& lora, Tensor* dx,
                          Tensor* dw, const LoraGradRef& dlora);

}  // namespace mt::cpu
