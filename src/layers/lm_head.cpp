#include "layers/lm_head.h"

#include <algorithm>

#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rmsnorm.h"

namespace mt {

namespace {
// Rows per logits chunk: about 16M floats (64 MiB) of logits at a time.
int64_t chunk_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(1, vocab)); }
}  // namespace

LmHeadOutput lm_head_forward(const BlockEnv& env, const Tensor& final_norm, const Tensor& head, const Tensor& x,
                             const Tensor& targets, bool want_logits) {
  LmHeadOutput r;
  const int64_t T = x.dim(0), V = head.dim(0);
  Tensor n = cpu::rmsnorm_forward(x, final_norm, env.eps(), env.bf16);
  const Tensor headf = cpu::param_f32(head);  // convert a BF16 head once, not per chunk
  if (want_logits) {
    r.logits = cpu::linear_forward(n, headf, env.bf16);
    if (targets.defined()) {
      auto ce = cpu::cross_entropy_forward(r.logits, targets);
      r.ce_sum = ce.loss_sum;
      r.count = ce.count;
    }
    return r;
  }
  if (!targets.defined()) return r;
  const int64_t step = chunk_rows(V);
  for (int64_t r0 = 0; r0 < T; r0 += step) {
    const int64_t r1 = std::min(T, r0 + step);
    Tensor logits = cpu::linear_forward(n.rows(r0, r1), headf, env.bf16);
    auto ce = cpu::cross_entropy_forward(logits, targets.rows(r0, r1));
    r.ce_sum += ce.loss_sum;
    r.count += ce.count;
  }
  return r;
}

Tensor lm_head_forward_backward(const BlockEnv& env, const Tensor& final_norm, const Tensor& head, const Tensor& x,
                                const Tensor& targets, float scale, Tensor& dfinal_norm, Tensor& dhead,
                                LmHeadOutput* out) {
  const int64_t T = x.dim(0), H = x.dim(1), V = head.dim(0);
  Tensor n = cpu::rmsnorm_forward(x, final_norm, env.eps(), env.bf16);
  const Tensor headf = cpu::param_f32(head);  // convert a BF16 head once, not per chunk
  Tensor dn = Tensor::empty({T, H}, DType::F32);
  const int64_t step = chunk_rows(V);
  LmHeadOutput r;
  for (int64_t r0 = 0; r0 < T; r0 += step) {
    const int64_t r1 = std::min(T, r0 + step);
    Tensor nc = n.rows(r0, r1), tc = targets.rows(r0, r1);
    Tensor logits = cpu::linear_forward(nc, headf, env.bf16);
    auto ce = cpu::cross_entropy_forward(logits, tc);
    r.ce_sum += ce.loss_sum;
    r.count += ce.count;
    Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
    cpu::cross_entropy_backward(logits, tc, scale, dlogits);
    Tensor dnc = dn.rows(r0, r1);
    cpu::linear_backward(dlogits, nc, headf, &dnc, &dhead);
  }
  if (out) {
    out->ce_sum = r.ce_sum;
    out->count = r.count;
  }
  return cpu::rmsnorm_backward(dn, x, final_norm, env.eps(), dfinal_norm);
}

}  // namespace mt
