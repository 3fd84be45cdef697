#include "kernels/cuda/lora.h"

#include "core/error.h"
#include "kernels/cuda/device_tensor_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm.h"

namespace mt::cuda {

namespace detail {
void lora_scale_bf16(const Tensor& src, Tensor& dst, float scale, cudaStream_t stream);  // lora.cu
}

int64_t LoraOperands::rank() const {
  MT_CHECK(a && a->defined() && a->ndim() >= 2, "lora: operand A missing");
  return a->dim(a->ndim() - 2);
}

namespace {

// The working copies' shapes: A' [(E,) r, in], B' [(E,) out, r], both BF16 on the device; returns r.
int64_t check_operands(const LoraOperands& l, int64_t experts, int64_t in, int64_t out, const char* op) {
  MT_CHECK(l.on() && l.b, "{}: adapter operands missing", op);
  const int64_t r = l.rank();
  const Shape sa = experts > 0 ? Shape{experts, r, in} : Shape{r, in};
  const Shape sb = experts > 0 ? Shape{experts, out, r} : Shape{out, r};
  check_device_tensor(*l.a, "lora A'", DType::BF16, sa);
  check_device_tensor(*l.b, "lora B'", DType::BF16, sb);
  return r;
}

void check_grads(const LoraOperands& l, const LoraGrads& g, const char* op) {
  MT_CHECK(g.a && g.b, "{}: adapter gradients missing", op);
  check_device_tensor(*g.a, "lora dA", DType::F32, l.a->shape());
  check_device_tensor(*g.b, "lora dB", DType::F32, l.b->shape());
}

int64_t out_of(const LoraOperands& l) { return l.b->dim(l.b->ndim() - 2); }
int64_t in_of(const LoraOperands& l) { return l.a->dim(l.a->ndim() - 1); }

}  // namespace

Tensor lora_forward_strided(int device, cudaStream_t stream, int64_t T, const void* x, int64_t ldx,
                            const LoraOperands& l, void* y, int64_t ldy) {
  const int64_t in = in_of(l), out = out_of(l);
  const int64_t r = check_operands(l, 0, in, out, "lora forward");
  Tensor u = Tensor::empty({T, r}, DType::BF16, Device::cuda(device));
  // u [T, r] = x · A'ᵀ, then y [T, out] = bf16(y + u · B'ᵀ) (beta 1: the epilogue adds the base output).
  gemm(device, stream, T, r, in, 1.0f, {x, DType::BF16, ldx, false}, {l.a->data(), DType::BF16, in, true}, 0.0f,
       u.data(), DType::BF16, r);
  gemm(device, stream, T, out, r, 1.0f, {u.data(), DType::BF16, r, false}, {l.b->data(), DType::BF16, r, true}, 1.0f,
       y, DType::BF16, ldy);
  return u;
}

void lora_backward_strided(int device, cudaStream_t stream, int64_t T, const void* dy, int64_t lddy, const void* x,
                           int64_t ldx, const Tensor& u, const LoraOperands& l, void* dx, int64_t lddx,
                           const LoraGrads& g) {
  const int64_t in = in_of(l), out = out_of(l);
  const int64_t r = check_operands(l, 0, in, out, "lora backward");
  check_grads(l, g, "lora backward");
  check_device_tensor(u, "lora u", DType::BF16, {T, r});
  // dB [out, r] += s · dyᵀ · u
  gemm(device, stream, out, r, T, l.scale, {dy, DType::BF16, lddy, true}, {u.data(), DType::BF16, r, false}, 1.0f,
       g.b->data(), DType::F32, r);
  // du [T, r] = dy · B' (= s·dy·B)
  Tensor du = Tensor::empty({T, r}, DType::BF16, Device::cuda(device));
  gemm(device, stream, T, r, out, 1.0f, {dy, DType::BF16, lddy, false}, {l.b->data(), DType::BF16, r, false}, 0.0f,
       du.data(), DType::BF16, r);
  // dA [r, in] += duᵀ · x
  gemm(device, stream, r, in, T, 1.0f, {du.data(), DType::BF16, r, true}, {x, DType::BF16, ldx, false}, 1.0f,
       g.a->data(), DType::F32, in);
  // dx [T, in] = bf16(dx + du · A')
  if (dx)
    gemm(device, stream, T, in, r, 1.0f, {du.data(), DType::BF16, r, false}, {l.a->data(), DType::BF16, in, false},
         1.0f, dx, DType::BF16, lddx);
}

Tensor lora_forward(const Tensor& x, const LoraOperands& l, Tensor& y, cudaStream_t stream) {
  MT_CHECK(l.on(), "lora forward: adapter operands missing");
  const int64_t in = in_of(l), out = out_of(l);
  MT_CHECK(x.ndim() == 2 && x.dim(1) == in && x.dtype() == DType::BF16 && x.device().is_cuda(),
           "lora forward: x must be BF16 [T, {}] on a CUDA device, found {}", in, x.desc());
  check_device_tensor(y, "lora y", DType::BF16, {x.dim(0), out});
  return lora_forward_strided(x.device().index, stream, x.dim(0), x.data(), in, l, y.data(), out);
}

void lora_backward(const Tensor& dy, const Tensor& x, const Tensor& u, const LoraOperands& l, Tensor& dx,
                   const LoraGrads& g, cudaStream_t stream) {
  MT_CHECK(l.on(), "lora backward: adapter operands missing");
  const int64_t in = in_of(l), out = out_of(l);
  MT_CHECK(x.ndim() == 2 && x.dim(1) == in && x.dtype() == DType::BF16 && x.device().is_cuda(),
           "lora backward: x must be BF16 [T, {}] on a CUDA device, found {}", in, x.desc());
  const int64_t T = x.dim(0);
  check_device_tensor(dy, "lora dy", DType::BF16, {T, out});
  if (dx.defined()) check_device_tensor(dx, "lora dx", DType::BF16, {T, in});
  lora_backward_strided(x.device().index, stream, T, dy.data(), out, x.data(), in, u, l,
                        dx.defined() ? dx.data() : nullptr, in, g);
}

Tensor lora_grouped_forward(const Tensor& x, const Tensor& offsets, const LoraOperands& l, Tensor& y,
                            cudaStream_t stream) {
  MT_CHECK(l.on() && l.a->ndim() == 3, "lora grouped forward: expert-stacked operands [E, r, in] needed");
  const int64_t E = l.a->dim(0), in = in_of(l), out = out_of(l);
  const int64_t r = check_operands(l, E, in, out, "lora grouped forward");
  MT_CHECK(r % 8 == 0, "LoRA on experts: r must be a multiple of 8 on the GPU (the grouped GEMMs' rows), found {}",
           r);
  const int64_t N = x.dim(0);
  Tensor u = Tensor::empty({N, r}, DType::BF16, x.device());
  grouped_gemm_forward(x, *l.a, offsets, u, stream);
  Tensor d = Tensor::empty({N, out}, DType::BF16, x.device());
  grouped_gemm_forward(u, *l.b, offsets, d, stream);
  lora_add_rows(y, d, 1.0f, offsets.data_as<int32_t>() + E, stream);
  return u;
}

void lora_grouped_backward(const Tensor& dy, const Tensor& x, const Tensor& u, const Tensor& offsets,
                           const LoraOperands& l, Tensor& dx, const LoraGrads& g, cudaStream_t stream) {
  MT_CHECK(l.on() && l.a->ndim() == 3, "lora grouped backward: expert-stacked operands [E, r, in] needed");
  const int64_t E = l.a->dim(0), in = in_of(l), out = out_of(l);
  const int64_t r = check_operands(l, E, in, out, "lora grouped backward");
  check_grads(l, g, "lora grouped backward");
  const int64_t N = x.dim(0);
  check_device_tensor(u, "lora u", DType::BF16, {N, r});
  // du = dy_e · B'_e; dA_e += du_eᵀ · x_e.
  Tensor du = Tensor::empty({N, r}, DType::BF16, x.device());
  grouped_gemm_dgrad(dy, *l.b, offsets, du, stream);
  grouped_gemm_wgrad(du, x, offsets, *g.a, /*accumulate=*/true, stream);
  // dB_e += dy_eᵀ · (s·u_e): the grouped wgrad has no alpha, so u is scaled first ([N, r], r values a row).
  Tensor us = Tensor::empty({N, r}, DType::BF16, x.device());
  detail::lora_scale_bf16(u, us, l.scale, stream);
  grouped_gemm_wgrad(dy, us, offsets, *g.b, /*accumulate=*/true, stream);
  us = Tensor();
  // dx = bf16(dx + bf16(du_e · A'_e))
  if (dx.defined()) {
    check_device_tensor(dx, "lora dx", DType::BF16, {N, in});
    Tensor dxl = Tensor::empty({N, in}, DType::BF16, x.device());
    grouped_gemm_dgrad(du, *l.a, offsets, dxl, stream);
    lora_add_rows(dx, dxl, 1.0f, offsets.data_as<int32_t>() + E, stream);
  }
}

}  // namespace mt::cuda
