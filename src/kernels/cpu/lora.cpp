#include "kernels/cpu/lora.h"

#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/linear.h"

namespace mt::cpu {

void lora_forward_rows(int64_t n, int64_t in, int64_t out, int64_t r, const float* x, int64_t ldx, const float* a,
                       const float* b, float scale, float* y, int64_t ldy) {
  if (n == 0) return;
  std::vector<float> u(static_cast<size_t>(n * r)), d(static_cast<size_t>(n * out));
  gemm_nt(n, r, in, 1.0f, x, ldx, a, in, 0.0f, u.data(), r);
  gemm_nt(n, out, r, 1.0f, u.data(), r, b, r, 0.0f, d.data(), out);
  // PEFT's order: d·s rounded to fp32, then added to the base output.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) y[i * ldy + o] += d[static_cast<size_t>(i * out + o)] * scale;
}

void lora_backward_rows(int64_t n, int64_t in, int64_t out, int64_t r, const float* x, int64_t ldx, const float* dy,
                        int64_t lddy, const float* a, const float* b, float scale, float* dx, int64_t lddx, float* da,
                        float* db) {
  if (n == 0) return;
  // Autograd's order through `d * scaling`: g = dy·s elementwise, then the GEMMs.
  std::vector<float> g(static_cast<size_t>(n * out)), u(static_cast<size_t>(n * r)), du(static_cast<size_t>(n * r));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) g[static_cast<size_t>(i * out + o)] = dy[i * lddy + o] * scale;
  gemm_nt(n, r, in, 1.0f, x, ldx, a, in, 0.0f, u.data(), r);              // u = x·Aᵀ (recomputed)
  gemm_tn(out, r, n, 1.0f, g.data(), out, u.data(), r, 1.0f, db, r);      // dB += gᵀ·u
  gemm_nn(n, r, out, 1.0f, g.data(), out, b, r, 0.0f, du.data(), r);      // du = g·B
  gemm_tn(r, in, n, 1.0f, du.data(), r, x, ldx, 1.0f, da, in);            // dA += duᵀ·x
  if (dx) gemm_nn(n, in, r, 1.0f, du.data(), r, a, in, 1.0f, dx, lddx);  // dx += du·A
}

namespace {
void check_pair(const LoraRef& l, int64_t in, int64_t out) {
  MT_CHECK(l.a && l.b && l.a->ndim() == 2 && l.b->ndim() == 2, "lora: A and B must be 2-d");
  const int64_t r = l.a->dim(0);
  check_f32(*l.a, "lora A", {r, in});
  check_f32(*l.b, "lora B", {out, r});
}
}  // namespace

Tensor lora_linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const LoraRef& lora, bool bf16) {
  if (!lora.on()) return linear_forward(x, w, bias, bf16);
  Tensor y = linear_forward(x, w, bias, bf16);
  const int64_t out = w.dim(0), in = w.dim(1), n = out == 0 ? 0 : y.numel() / out;
  check_pair(lora, in, out);
  lora_forward_rows(n, in, out, lora.a->dim(0), x.data_as<float>(), in, lora.a->data_as<float>(),
                    lora.b->data_as<float>(), lora.scale, y.data_as<float>(), out);
  if (bf16) round_bf16_inplace(y.data_as<float>(), y.numel());
  return y;
}

void lora_linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const LoraRef& lora, Tensor* dx,
                          Tensor* dw, const LoraGradRef& dlora) {
  linear_backward(dy, x, w, dx, dw);
  if (!lora.on()) return;
  const int64_t out = w.dim(0), in = w.dim(1), n = in == 0 ? 0 : x.numel() / in;
  check_pair(lora, in, out);
  MT_CHECK(dlora.a && dlora.b, "lora backward: gradients missing");
  check_f32(*dlora.a, "lora dA", lora.a->shape());
  check_f32(*dlora.b, "lora dB", lora.b->shape());
  lora_backward_rows(n, in, out, lora.a->dim(0), x.data_as<float>(), in, dy.data_as<float>(), out,
                     lora.a->data_as<float>(), lora.b->data_as<float>(), lora.scale, dx ? dx->data_as<float>() : nullptr,
                     in, dlora.a->data_as<float>(), dlora.b->data_as<float>());
}

}  // namespace mt::cpu
