#include "kernels/cpu/linear.h"

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

Tensor linear_forward(const Tensor& x, const Tensor& w, bool bf16) { return linear_forward(x, w, Tensor(), bf16); }

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, bool bf16) {
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
  if (b.defined()) {
    MT_CHECK(b.ndim() == 1 && b.dim(0) == out, "linear bias {} does not match weight {}", b.desc(), w.desc());
    const Tensor bf = param_f32(b);
    const float* bp = bf.data_as<float>();
    float* yp = y.data_as<float>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) yp[r * out + o] += bp[o];
  }
  if (bf16) round_bf16_inplace(y.data_as<float>(), y.numel());
  return y;
}

void bias_backward(const Tensor& dy, Tensor& db) {
  if (!db.defined()) return;  // a frozen bias
  MT_CHECK(db.ndim() == 1, "bias gradient must be 1-d, got {}", db.desc());
  const int64_t out = db.dim(0), n = out == 0 ? 0 : dy.numel() / out;
  check_f32_numel(dy, "bias dy", n * out);
  check_f32(db, "bias db", {out});
  const float* d = dy.data_as<float>();
  float* g = db.data_as<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) g[o] += d[r * out + o];
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
