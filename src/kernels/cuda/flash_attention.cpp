#include "kernels/cuda/flash_attention.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/cuda/device_tensor_check.h"
#include "kernels/cuda/flash_attention_dims.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

void check_flat(const Tensor& t, const char* what, DType dt, int64_t numel, Device dev) {
  MT_CHECK(t.defined(), "{} is undefined", what);
  MT_CHECK(t.device() == dev, "{} on {}, expected {}", what, t.device().str(), dev.str());
  MT_CHECK(t.dtype() == dt && t.numel() == numel, "{}: expected {} with {} elements, found {}", what,
           dtype_safetensors_name(dt), numel, t.desc());
}

float default_scale(int64_t head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

int64_t value_dim(const FlashAttentionShape& s) { return s.v_dim > 0 ? s.v_dim : s.head_dim; }

detail::FlashArgs check_args(const FlashAttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionDocs& docs, const Tensor& sinks) {
  MT_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0, "flash attention heads {} / kv_heads {}",
           s.heads, s.kv_heads);
  MT_CHECK(s.v_dim >= 0, "flash attention v_dim {} (0: head_dim)", s.v_dim);
  const int64_t dv = value_dim(s);
  if (dv == s.head_dim)
    MT_CHECK(flash_attention_head_dim_supported(s.head_dim), "flash attention head_dim {} ({})", s.head_dim,
             flash_attention_head_dims());
  else
    MT_CHECK(flash_attention_dims_supported(s.head_dim, dv), "flash attention head_dim {} with v_dim {} ({})",
             s.head_dim, dv, flash_attention_mla_dims());
  MT_CHECK(s.tokens >= 0 && s.tokens * s.heads < (int64_t{1} << 31) && s.heads <= 65535,
           "flash attention: {} tokens x {} heads", s.tokens, s.heads);
  MT_CHECK(s.window >= 0, "flash attention window {} (0: none)", s.window);
  MT_CHECK(std::isfinite(s.scale) && s.scale >= 0.0f, "flash attention scale {} (0: head_dim^-1/2)", s.scale);
  MT_CHECK(q.defined() && q.device().is_cuda(), "flash attention q must be a CUDA tensor");
  const Device dev = q.device();
  check_flat(q, "flash attention q", DType::BF16, s.tokens * s.heads * s.head_dim, dev);
  check_flat(k, "flash attention k", DType::BF16, s.tokens * s.kv_heads * s.head_dim, dev);
  check_flat(v, "flash attention v", DType::BF16, s.tokens * s.kv_heads * dv, dev);
  check_flat(docs.start, "attention doc start", DType::I32, s.tokens, dev);
  check_flat(docs.end, "attention doc end", DType::I32, s.tokens, dev);
  detail::FlashArgs a;
  a.T = static_cast<int>(s.tokens);
  a.Hq = static_cast<int>(s.heads);
  a.Hk = static_cast<int>(s.kv_heads);
  a.D = static_cast<int>(s.head_dim);
  a.Dv = static_cast<int>(dv);
  // A window that reaches past the first token of every row (window >= T) masks nothing: none.
  a.window = s.window < s.tokens ? static_cast<int>(s.window) : 0;
  a.scale = s.scale > 0.0f ? s.scale : default_scale(s.head_dim);
  a.doc_start = docs.start.data_as<int32_t>();
  a.doc_end = docs.end.data_as<int32_t>();
  if (sinks.defined()) {
    check_flat(sinks, "flash attention sinks", DType::F32, s.heads, dev);
    a.sinks = sinks.data_as<float>();
  }
  return a;
}

std::atomic<detail::FlashFwdKernel> g_fwd_kernel{detail::FlashFwdKernel::Auto};

// The Hopper forward is the default where it runs (head_dim 128 on a cc 9.0 GPU; head_dim 64 opt-in, below);
// MIXTUNE_FLASH_FWD=mma
// selects the mma.sync kernel (read once; for A/B measurements).
bool sm90_forward_allowed() {
  static const bool on = env_allows_sm90("MIXTUNE_FLASH_FWD");
  return on;
}


// The head_dim 64 sm90 forward is Auto's choice (H100, GPT-OSS's shapes: 2.02x the mma.sync forward without a
// window, 1.24x with the 128-key window; +0.7% of the gpt-oss-20b slice's step, bench/RESULTS.md session 32);
// MIXTUNE_FLASH_FWD_SM90_HD64=0 (read once) keeps head_dim 64 on mma.sync.
bool sm90_forward_hd64_opted_in() {
  static const bool on = [] {
    const char* e = std::getenv("MIXTUNE_FLASH_FWD_SM90_HD64");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// MLA's D 192 / Dv 128 sm90 forward: Auto's default since its tests passed on an H200 (session 34: 2.55x the
// mma.sync forward, NOTES.md flash attention); MIXTUNE_FLASH_FWD_SM90_MLA=0 (read once) opts out.
bool sm90_forward_mla_opted_in() {
  static const bool on = [] {
    const char* e = std::getenv("MIXTUNE_FLASH_FWD_SM90_MLA");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// Whether the forward runs the sm90 kernel (flash_fwd_kernel_get, then the environment).
bool use_sm90_forward(const detail::FlashArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out) {
  const detail::FlashFwdKernel kind = detail::flash_fwd_kernel_get();
  if (kind == detail::FlashFwdKernel::MmaSync) return false;
  const bool aligned = aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out);
  if (kind == detail::FlashFwdKernel::Sm90) {
    MT_CHECK(detail::flash_fwd_sm90_takes_args(a),
             "flash attention forward: the sm90 kernel has no sliding window, sinks or (at head_dim 128) softmax "
             "scale other than head_dim^-1/2 (head_dim {}, window {}, sinks {}, scale {}); select the mma.sync kernel",
             a.D, a.window, a.sinks ? "given" : "none", a.scale);
    MT_CHECK(detail::flash_fwd_sm90_supported(a),
             "flash attention forward: the sm90 kernel needs head_dim 128 or 64, or 192 with v_dim 128 (got {} / {}), "
             "a cc 9.0 GPU and an sm_90a build",
             a.D, a.Dv);
    MT_CHECK(aligned, "flash attention forward: the sm90 kernel needs 16-byte aligned q, k, v and out");
    return true;
  }
  return sm90_forward_allowed() && aligned && (a.D != 64 || sm90_forward_hd64_opted_in()) &&
         (a.Dv == a.D || sm90_forward_mla_opted_in()) &&
         detail::flash_fwd_sm90_takes_args(a) && detail::flash_fwd_sm90_supported(a);
}

std::atomic<detail::FlashBwdKernel> g_bwd_kernel{detail::FlashBwdKernel::Auto};

// The Hopper backward is the default where it runs (head_dim 128 on a cc 9.0 GPU); MIXTUNE_FLASH_BWD=mma
// selects the mma.sync kernel (read once; for A/B measurements).
bool sm90_backward_allowed() {
  static const bool on = env_allows_sm90("MIXTUNE_FLASH_BWD");
  return on;
}

// MLA's D 192 / Dv 128 sm90 backward (flash_attention_bwd_sm90_mla.cu): Auto's default since its tests passed on a
// cc 9.0 GPU (bench/RESULTS.md session 35); MIXTUNE_FLASH_BWD_SM90_MLA=0 (read once) opts out, as for the forward.
bool sm90_backward_mla_opted_in() {
  static const bool on = [] {
    const char* e = std::getenv("MIXTUNE_FLASH_BWD_SM90_MLA");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// Whether the backward runs the sm90 kernel (flash_bwd_kernel_get, then the environment).
bool use_sm90_backward(const detail::FlashArgs& a, const Tensor& dout, const Tensor& q, const Tensor& k,
                       const Tensor& v) {
  const detail::FlashBwdKernel kind = detail::flash_bwd_kernel_get();
  if (kind == detail::FlashBwdKernel::MmaSync) return false;
  const bool aligned = aligned16(dout) && aligned16(q) && aligned16(k) && aligned16(v);
  if (kind == detail::FlashBwdKernel::Sm90) {
    MT_CHECK(detail::flash_bwd_sm90_takes_args(a),
             "flash attention backward: the sm90 kernel has no sliding window, sinks or (at head_dim 128) softmax "
             "scale other than head_dim^-1/2 (head_dim {}, window {}, sinks {}, scale {}); select the mma.sync kernel",
             a.D, a.window, a.sinks || a.dsinks ? "given" : "none", a.scale);
    MT_CHECK(detail::flash_bwd_sm90_supported(a),
             "flash attention backward: the sm90 kernel needs head_dim and v_dim 128, or head_dim 192 with v_dim 128 "
             "(got {} / {}), a cc 9.0 GPU and an sm_90a build",
             a.D, a.Dv);
    MT_CHECK(aligned, "flash attention backward: the sm90 kernel needs 16-byte aligned dout, q, k and v");
    return true;
  }
  return sm90_backward_allowed() && aligned && (a.D != 192 || sm90_backward_mla_opted_in()) &&
         detail::flash_bwd_sm90_takes_args(a) && detail::flash_bwd_sm90_supported(a);
}

// out's shape: q's (head_dim == v_dim), q's with the last dim v_dim where that is head_dim, else [T, heads, Dv].
Shape out_shape(const FlashAttentionShape& s, const Tensor& q) {
  const int64_t vdim = value_dim(s);
  if (vdim == s.head_dim) return q.shape();
  if (q.ndim() >= 1 && q.dim(-1) == s.head_dim) {
    Shape sh = q.shape();
    sh.back() = vdim;
    return sh;
  }
  return {s.tokens, s.heads, vdim};
}

void ensure(Tensor& t, const Tensor& like, const char* what) {
  if (!t.defined())
    t = Tensor::empty(like.shape(), like.dtype(), like.device());
  else
    check_flat(t, what, like.dtype(), like.numel(), like.device());
}

}  // namespace

AttentionDocs attention_docs_from_ids(const Tensor& doc, int64_t batch, int64_t seq, int device, cudaStream_t stream) {
  MT_CHECK(batch >= 0 && seq >= 0 && batch * seq < (int64_t{1} << 31) && batch <= 65535,
           "attention docs: batch {} x seq {}", batch, seq);
  if (doc.defined()) check_device_tensor(doc, "attention doc ids", DType::I32, {batch, seq});
  AttentionDocs d{Tensor::empty({batch * seq}, DType::I32, Device::cuda(device)),
                  Tensor::empty({batch * seq}, DType::I32, Device::cuda(device))};
  detail::attention_docs_from_ids_launch(doc.defined() ? doc.data_as<int32_t>() : nullptr, static_cast<int>(batch),
                                         static_cast<int>(seq), d.start.data_as<int32_t>(), d.end.data_as<int32_t>(),
                                         stream);
  return d;
}

AttentionDocs attention_docs_from_cu_seqlens(const Tensor& cu_seqlens, int64_t tokens, cudaStream_t stream) {
  MT_CHECK(cu_seqlens.defined() && cu_seqlens.ndim() == 1 && cu_seqlens.dim(0) >= 1,
           "attention cu_seqlens must be [docs + 1]");
  check_device_tensor(cu_seqlens, "attention cu_seqlens", DType::I32, {cu_seqlens.dim(0)});
  MT_CHECK(tokens >= 0 && tokens < (int64_t{1} << 31), "attention docs: {} tokens", tokens);
  AttentionDocs d{Tensor::empty({tokens}, DType::I32, cu_seqlens.device()),
                  Tensor::empty({tokens}, DType::I32, cu_seqlens.device())};
  detail::attention_docs_from_cu_seqlens_launch(cu_seqlens.data_as<int32_t>(), static_cast<int>(cu_seqlens.dim(0) - 1),
                                                d.start.data_as<int32_t>(), d.end.data_as<int32_t>(), stream);
  return d;
}

void flash_attention_forward(const FlashAttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionDocs& docs, Tensor& out, Tensor& lse, cudaStream_t stream,
                             const Tensor& sinks) {
  const detail::FlashArgs a = check_args(s, q, k, v, docs, sinks);
  if (!out.defined())
    out = Tensor::empty(out_shape(s, q), DType::BF16, q.device());
  else
    check_flat(out, "flash attention out", DType::BF16, s.tokens * s.heads * a.Dv, q.device());
  if (!lse.defined())
    lse = Tensor::empty({s.heads, s.tokens}, DType::F32, q.device());
  else
    check_flat(lse, "flash attention lse", DType::F32, s.heads * s.tokens, q.device());
  if (s.tokens == 0) return;
  if (use_sm90_forward(a, q, k, v, out))
    detail::flash_fwd_sm90_launch(a, q.data(), k.data(), v.data(), out.data(), lse.data_as<float>(), stream);
  else
    detail::flash_fwd_launch(a, q.data(), k.data(), v.data(), out.data(), lse.data_as<float>(), stream);
}

void flash_attention_backward(const FlashAttentionShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionDocs& docs,
                              Tensor& dq, Tensor& dk, Tensor& dv, cudaStream_t stream, FlashDqSums* dq_sums,
                              FlashBwdMode mode, const Tensor& sinks, Tensor* dsinks) {
  detail::FlashArgs a = check_args(s, q, k, v, docs, sinks);
  if (dsinks) {
    MT_CHECK(sinks.defined(), "flash attention backward: dsinks without sinks");
    check_flat(*dsinks, "flash attention dsinks", DType::F32, s.heads, q.device());
    a.dsinks = dsinks->data_as<float>();
  }
  const int64_t out_numel = s.tokens * s.heads * a.Dv;
  check_flat(dout, "flash attention dout", DType::BF16, out_numel, q.device());
  check_flat(out, "flash attention out", DType::BF16, out_numel, q.device());
  check_flat(lse, "flash attention lse", DType::F32, s.heads * s.tokens, q.device());
  const bool det = mode == FlashBwdMode::deterministic;
  const bool sm90 = !det && use_sm90_backward(a, dout, q, k, v);
  const bool sums_out = dq_sums && sm90 && a.D == 128;  // the 192 / 128 sm90 kernel makes a bf16 dq
  if (dq_sums) *dq_sums = {};
  if (!sums_out) ensure(dq, q, "flash attention dq");
  ensure(dk, k, "flash attention dk");
  ensure(dv, v, "flash attention dv");
  // The prologue reads dout and out in 16-byte packets; dK and dV are stored 4 elements (8 bytes) at a time.
  MT_CHECK(aligned16(dout.data()) && aligned16(out.data()),
           "flash attention backward: dout and out must be 16-byte aligned");
  MT_CHECK(reinterpret_cast<uintptr_t>(dk.data()) % 8 == 0 && reinterpret_cast<uintptr_t>(dv.data()) % 8 == 0,
           "flash attention backward: dk and dv must be 8-byte aligned");
  Tensor dq_acc = Tensor::empty({q.numel()}, DType::F32, q.device());
  // The deterministic backward keeps each query head's dK, dV apart until the group sum: [T][Hq][D], [T][Hq][Dv].
  const int64_t k_acc = det ? q.numel() : k.numel(), v_acc = det ? out_numel : v.numel();
  Tensor dk_acc = Tensor::empty({k_acc}, DType::F32, q.device());
  Tensor dv_acc = Tensor::empty({v_acc}, DType::F32, q.device());
  Tensor delta = Tensor::empty({s.heads * s.tokens + 1}, DType::F32, q.device());  // + the sm90 item counter
  if (sums_out) *dq_sums = {dq_acc, a.scale, s.tokens, s.heads};
  if (s.tokens == 0) return;
  auto* launch = det ? detail::flash_bwd_deterministic_launch
                     : sm90 ? detail::flash_bwd_sm90_launch : detail::flash_bwd_launch;
  launch(a, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data_as<float>(),
         sums_out ? nullptr : dq.data(), dk.data(), dv.data(), dq_acc.data_as<float>(), dk_acc.data_as<float>(),
         dv_acc.data_as<float>(), delta.data_as<float>(), stream);
}

void flash_dq_sums_to_bf16(const FlashDqSums& sums, Tensor& dq, cudaStream_t stream) {
  MT_CHECK(sums.acc.defined(), "flash dq sums: none (the backward made a bf16 dq)");
  check_flat(dq, "flash attention dq", DType::BF16, sums.tokens * sums.heads * 128, sums.acc.device());
  detail::flash_dq_sums_to_bf16(sums.acc.data_as<float>(), static_cast<int>(sums.tokens), static_cast<int>(sums.heads),
                                sums.scale, dq.data(), stream);
}

namespace detail {

bool flash_args_plain(const FlashArgs& a) {
  return a.window == 0 && a.sinks == nullptr && a.dsinks == nullptr && a.scale == default_scale(a.D);
}

// MLA's 192 / 128: any scale (its yarn scale), no window or sinks; head_dim 128: plain only.
bool flash_bwd_sm90_takes_args(const FlashArgs& a) {
  if (a.D == 192) return a.window == 0 && a.sinks == nullptr && a.dsinks == nullptr;
  return flash_args_plain(a);
}

void flash_fwd_kernel_set(FlashFwdKernel k) { g_fwd_kernel.store(k); }
FlashFwdKernel flash_fwd_kernel_get() { return g_fwd_kernel.load(); }
void flash_bwd_kernel_set(FlashBwdKernel k) { g_bwd_kernel.store(k); }
FlashBwdKernel flash_bwd_kernel_get() { return g_bwd_kernel.load(); }

}  // namespace detail

}  // namespace mt::cuda
