#include "kernels/cuda/mla_assemble.h"

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace mt::cuda {

namespace {

void check_flat(const Tensor& t, const char* what, int64_t numel, const Device& dev) {
  MT_CHECK(t.defined(), "mla: {} is undefined", what);
  MT_CHECK(t.device() == dev, "mla: {} on {}, expected {}", what, t.device().str(), dev.str());
  MT_CHECK(t.dtype() == DType::BF16 && t.numel() == numel, "mla: {}: expected BF16 with {} elements, found {}", what,
           numel, t.desc());
}

struct Checked {
  int64_t T, H, nope, rope, dv, dv_pad, ld_ckv;
};

Checked check_dims(const MlaAssembleDims& d, const Tensor& ckv, const Tensor& cos, const Tensor& sin,
                   const Device& dev) {
  const int64_t dv_pad = d.v_pad > 0 ? d.v_pad : d.v_dim;
  MT_CHECK(d.tokens >= 0 && d.heads > 0 && d.nope >= 0 && d.rope > 0 && d.rope % 2 == 0 && d.v_dim > 0 &&
               dv_pad >= d.v_dim,
           "mla: tokens {} heads {} nope {} rope {} (even, > 0) v_dim {} v_pad {}", d.tokens, d.heads, d.nope, d.rope,
           d.v_dim, d.v_pad);
  MT_CHECK(d.tokens * d.heads * (d.nope + d.rope + dv_pad) < (int64_t{1} << 40), "mla: {} tokens x {} heads", d.tokens,
           d.heads);
  MT_CHECK(ckv.defined() && ckv.ndim() == 2 && ckv.dim(0) == d.tokens && ckv.dim(1) > d.rope,
           "mla: ckv must be [T={}, kv_lora + {}], found {}", d.tokens, d.rope,
           ckv.defined() ? ckv.desc() : "undefined");
  check_flat(ckv, "ckv", ckv.numel(), dev);
  const int64_t half = d.rope / 2;
  for (const Tensor* t : {&cos, &sin}) {
    MT_CHECK(t->defined() && t->device() == dev && t->dtype() == DType::F32 && t->numel() == d.tokens * half,
             "mla: RoPE table must be F32 [T={}, {}] on {}, found {}", d.tokens, half, dev.str(),
             t->defined() ? t->desc() : "undefined");
  }
  return {d.tokens, d.heads, d.nope, d.rope, d.v_dim, dv_pad, ckv.dim(1)};
}

}  // namespace

void mla_assemble_forward(const MlaAssembleDims& d, const Tensor& q, const Tensor& ckv, const Tensor& kv,
                          const Tensor& cos, const Tensor& sin, Tensor& query, Tensor& key, Tensor& value,
                          cudaStream_t stream) {
  MT_CHECK(q.defined() && q.device().is_cuda(), "mla: q must be a CUDA tensor");
  const Device dev = q.device();
  const Checked c = check_dims(d, ckv, cos, sin, dev);
  const int64_t D = c.nope + c.rope;
  check_flat(q, "q", c.T * c.H * D, dev);
  check_flat(kv, "kv", c.T * c.H * (c.nope + c.dv), dev);
  check_flat(query, "query", c.T * c.H * D, dev);
  check_flat(key, "key", c.T * c.H * D, dev);
  check_flat(value, "value", c.T * c.H * c.dv_pad, dev);
  detail::mla_assemble_forward_launch(q.data(), ckv.data(), c.ld_ckv, kv.data(), cos.data_as<float>(),
                                      sin.data_as<float>(), c.T, c.H, c.nope, c.rope, c.dv, c.dv_pad, d.interleaved,
                                      query.data(), key.data(), value.data(), stream);
}

void mla_assemble_backward(const MlaAssembleDims& d, const Tensor& dquery, const Tensor& dkey, const Tensor& dvalue,
                           const Tensor& cos, const Tensor& sin, Tensor& dq, Tensor& dkv, Tensor& dckv,
                           cudaStream_t stream) {
  MT_CHECK(dquery.defined() && dquery.device().is_cuda(), "mla: dquery must be a CUDA tensor");
  const Device dev = dquery.device();
  const Checked c = check_dims(d, dckv, cos, sin, dev);
  const int64_t D = c.nope + c.rope;
  check_flat(dquery, "dquery", c.T * c.H * D, dev);
  check_flat(dkey, "dkey", c.T * c.H * D, dev);
  check_flat(dvalue, "dvalue", c.T * c.H * c.dv_pad, dev);
  check_flat(dq, "dq", c.T * c.H * D, dev);
  check_flat(dkv, "dkv", c.T * c.H * (c.nope + c.dv), dev);
  detail::mla_assemble_backward_launch(dquery.data(), dkey.data(), dvalue.data(), cos.data_as<float>(),
                                       sin.data_as<float>(), c.T, c.H, c.nope, c.rope, c.dv, c.dv_pad, d.interleaved,
                                       dq.data(), dkv.data(), dckv.data(), c.ld_ckv, stream);
}

void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t cols,
                  cudaStream_t stream) {
  MT_CHECK(src.defined() && dst.defined() && src.ndim() == 2 && dst.ndim() == 2 && src.dim(0) == dst.dim(0),
           "copy_columns: src and dst must be 2-D with the same rows, found {} and {}",
           src.defined() ? src.desc() : "undefined", dst.defined() ? dst.desc() : "undefined");
  MT_CHECK(src.device().is_cuda() && src.device() == dst.device() && src.dtype() == dst.dtype(),
           "copy_columns: {} on {} and {} on {}", src.desc(), src.device().str(), dst.desc(), dst.device().str());
  MT_CHECK(cols >= 0 && src_col >= 0 && dst_col >= 0 && src_col + cols <= src.dim(1) && dst_col + cols <= dst.dim(1),
           "copy_columns: columns [{}, +{}) of {} into [{}, +{}) of {}", src_col, cols, src.desc(), dst_col, cols,
           dst.desc());
  const int64_t rows = src.dim(0), es = static_cast<int64_t>(dtype_size(src.dtype()));
  if (rows == 0 || cols == 0) return;
  MT_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data()) + dst_col * es, static_cast<size_t>(dst.dim(1) * es),
                                  static_cast<const char*>(src.data()) + src_col * es,
                                  static_cast<size_t>(src.dim(1) * es), static_cast<size_t>(cols * es),
                                  static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream));
}

}  // namespace mt::cuda
