#include "kernels/cpu/linear.h"

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

Tensor linear_forward(const Tensor& x, const Tensor& w, bool bf16) {
  MT_CHECK(w.ndim() == 2, "linear weight must be 2-d, got {}", w.desc());
  const int64_t out = w.dim(0), in = w.dim(1);
  MT_CHECK(x.ndim() >= 1 && x.dim(-1) == in, "linear input {} does not match weight {}", x.desc(), w.desc());
  check_f32_numel(x, "linear input", x.numel());
  const int64_t n = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Shape ys = x.shape();
  ys.back() = out;
  Tensor y = Tensor::empty(ys, DType::F32);
  Tensor wf = param_f32(w);
  gemm_nt(n, out, in, 1.0f, x.data_as<float>(), in, wf.data_as<float>(), in, 0.0f, y.data_as<float>(), out);
  if (bf16) round_bf16_inplace(y.data_as<float>(), y.numel());
  return y;
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw) {
  const int64_t out = w.dim(0), in = w.dim(1);
  const int64_t n = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  check_f32_numel(dy, "linear dy", n * out);
  check_f32_numel(x, "linear x", n * in);
  if (dx) {
    check_f32_numel(*dx, "linear dx", n * in);
    Tensor wf = param_f32(w);
    gemm_nn(n, in, out, 1.0f, dy.data_as<float>(), out, wf.data_as<float>(), in, 0.0f, dx->data_as<float>(), in);
  }
  if (dw) {
    check_f32(*dw, "linear dw", {out, in});
    gemm_tn(out, in, n, 1.0f, dy.data_as<float>(), out, x.data_as<float>(), in, 1.0f, dw->data_as<float>(), in);
  }
}

}  // namespace mt::cpu
