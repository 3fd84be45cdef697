#include "layers/lm_head.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rmsnorm.h"

namespace mt {

namespace {
// Rows per logits chunk: about 16M floats (64 MiB) of logits at a time.
int64_t chunk_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(1, vocab)); }

// Rows whose (shifted) target counts. Rows without one contribute nothing to the loss or any gradient,
// so the head GEMMs run on the others only: with answer-only chat data that is most of the head's work.
std::vector<int64_t> target_rows(const Tensor& targets) {
  std::vector<int64_t> rows;
  const int64_t T = targets.numel();
  const bool i64 = targets.dtype() == DType::I64;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t y = i64 ? targets.data_as<int64_t>()[t] : targets.data_as<int32_t>()[t];
    if (y != -100) rows.push_back(t);
  }
  return rows;
}

// out[i] = src[rows[i]] for a [T, C] tensor (F32 or the targets' integer type).
Tensor gather_rows(const Tensor& src, const std::vector<int64_t>& rows) {
  const int64_t C = src.numel() / std::max<int64_t>(1, src.dim(0));
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(src.dtype());
  Shape shape = src.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(shape, src.dtype());
  const char* from = static_cast<const char*>(src.data());
  char* to = static_cast<char*>(out.data());
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(to + i * row_bytes, from + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  return out;
}
}  // namespace

LmHeadOutput lm_head_forward(const BlockEnv& env, const Tensor& final_norm, const Tensor& head, const Tensor& x,
                             const Tensor& targets, bool want_logits) {
  LmHeadOutput r;
  const int64_t V = head.dim(0);
  Tensor n = cpu::rmsnorm_forward(x, final_norm, env.eps(), env.bf16, env.norm_rounds_once());
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
  const std::vector<int64_t> rows = target_rows(targets);
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R == 0) return r;
  const Tensor nv = gather_rows(n, rows), tv = gather_rows(targets, rows);
  const int64_t step = chunk_rows(V);
  for (int64_t r0 = 0; r0 < R; r0 += step) {
    const int64_t r1 = std::min(R, r0 + step);
    Tensor logits = cpu::linear_forward(nv.rows(r0, r1), headf, env.bf16);
    auto ce = cpu::cross_entropy_forward(logits, tv.rows(r0, r1));
    r.ce_sum += ce.loss_sum;
    r.count += ce.count;
  }
  return r;
}

Tensor lm_head_forward_backward(const BlockEnv& env, const Tensor& final_norm, const Tensor& head, const Tensor& x,
                                const Tensor& targets, float scale, Tensor& dfinal_norm, Tensor& dhead,
                                LmHeadOutput* out) {
  const int64_t T = x.dim(0), H = x.dim(1), V = head.dim(0);
  Tensor n = cpu::rmsnorm_forward(x, final_norm, env.eps(), env.bf16, env.norm_rounds_once());
  const Tensor headf = cpu::param_f32(head);  // convert a BF16 head once, not per chunk
  Tensor dn = Tensor::zeros({T, H}, DType::F32);
  const std::vector<int64_t> rows = target_rows(targets);
  const int64_t R = static_cast<int64_t>(rows.size());
  const Tensor nv = gather_rows(n, rows), tv = gather_rows(targets, rows);
  Tensor dnv = Tensor::empty({R, H}, DType::F32);
  const int64_t step = chunk_rows(V);
  LmHeadOutput r;
  for (int64_t r0 = 0; r0 < R; r0 += step) {
    const int64_t r1 = std::min(R, r0 + step);
    Tensor nc = nv.rows(r0, r1), tc = tv.rows(r0, r1);
    Tensor logits = cpu::linear_forward(nc, headf, env.bf16);
    auto ce = cpu::cross_entropy_forward(logits, tc);
    r.ce_sum += ce.loss_sum;
    r.count += ce.count;
    Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
    cpu::cross_entropy_backward(logits, tc, scale, dlogits);
    Tensor dnc = dnv.rows(r0, r1);
    cpu::linear_backward(dlogits, nc, headf, &dnc, dhead.defined() ? &dhead : nullptr);  // undefined: frozen
  }
  float* dnp = dn.data_as<float>();
  const float* dnvp = dnv.data_as<float>();
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(dnp + rows[static_cast<size_t>(i)] * H, dnvp + i * H, static_cast<size_t>(H) * sizeof(float));
  if (out) {
    out->ce_sum = r.ce_sum;
    out->count = r.count;
  }
  return cpu::rmsnorm_backward(dn, x, final_norm, env.eps(), dfinal_norm);
}

}  // namespace mt
