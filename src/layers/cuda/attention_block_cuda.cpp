#include "layers/cuda/attention_block_cuda.h"

#include <utility>

#include "kernels/cuda/bias.h"
#include "kernels/cuda/dtype_cast.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"

namespace mt {

namespace {

cuda::FlashAttentionShape flash_shape(const CudaBlockEnv& env, const AttentionSpec& spec) {
  cuda::FlashAttentionShape s{env.tokens(), spec.heads, spec.kv_heads, spec.head_dim};
  s.window = spec.sliding_window;
  s.scale = static_cast<float>(spec.scale);
  return s;
}

// y = x·wᵀ (+ b where the spec has biases), one rounding either way.
void project(const CudaBlockEnv& env, bool bias, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  if (bias)
    cuda::linear_forward_bias(x, w, b, y, env.stream);
  else
    cuda::linear_forward(x, w, y, env.stream);
}

// A frozen parameter's gradient slot: a scratch buffer for the fused kernels that always add one (the norms' dw
// sums come out of the same pass as dx), discarded.
Tensor& grad_or_scratch(const CudaBlockEnv& env, Tensor& g, const Tensor& like, Tensor& scratch) {
  if (g.defined()) return g;
  scratch = Tensor::empty(like.shape(), DType::F32, env.dev());
  return scratch;
}

// The sink logits as the flash kernels take them (F32 [heads]; the parameter is BF16), or none.
Tensor sinks_f32(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w) {
  if (!spec.sinks) return Tensor();
  Tensor s = Tensor::empty({spec.heads}, DType::F32, env.dev());
  cuda::cast_async(w.sinks, s, env.stream);
  return s;
}

bool has_rope(const AttentionSpec& spec) { return spec.rope.kind != RopeKind::none; }

// x [T, heads·D] -> rope(rms_norm over each head's D values) in one pass with the QK-norm, or rope(x) without it.
// Without RoPE (NoPE: Nemotron-H) the QK-norm alone, or x itself (no copy: qr and kr are q and k).
Tensor norm_rope(const CudaBlockEnv& env, const AttentionSpec& spec, const Tensor& x, const Tensor& norm_w,
                 int64_t heads) {
  const int64_t T = env.tokens(), D = spec.head_dim;
  if (!has_rope(spec) && !spec.qk_norm) return x;
  Tensor n = env.bf16({T * heads, D});
  if (!has_rope(spec)) {
    cuda::rmsnorm_forward(x.view({T * heads, D}), norm_w, env.eps(), n, nullptr, env.stream);
    return n.view({T, heads * D});
  }
  const CudaRopeTable& rope = env.batch->rope_table(spec);
  if (spec.qk_norm)
    cuda::rmsnorm_rope_forward(x.view({T * heads, D}), norm_w, env.eps(), rope.cos, rope.sin, n, env.stream);
  else
    cuda::rope_forward(x.view({T * heads, D}), rope.cos, rope.sin, n, env.stream);
  return n.view({T, heads * D});
}

}  // namespace

Tensor attention_block_forward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                    const Tensor& a, AttentionActsCuda& acts) {
  const int64_t T = env.tokens(), D = spec.head_dim, Hq = spec.heads, Hkv = spec.kv_heads;
  env.phase(cuda::Phase::attention);
  acts.a = a;
  acts.q = env.bf16({T, Hq * D});
  acts.k = env.bf16({T, Hkv * D});
  acts.v = env.bf16({T, Hkv * D});
  project(env, spec.qkv_bias, a, w.q_proj, w.q_bias, acts.q);
  project(env, spec.qkv_bias, a, w.k_proj, w.k_bias, acts.k);
  project(env, spec.qkv_bias, a, w.v_proj, w.v_bias, acts.v);
  acts.uq = env.lora_forward(WeightSlot::q_proj, a, acts.q);
  acts.uk = env.lora_forward(WeightSlot::k_proj, a, acts.k);
  acts.uv = env.lora_forward(WeightSlot::v_proj, a, acts.v);
  acts.qr = norm_rope(env, spec, acts.q, w.q_norm, Hq);
  acts.kr = norm_rope(env, spec, acts.k, w.k_norm, Hkv);
  acts.o = env.bf16({T, Hq * D});
  acts.lse = Tensor();
  cuda::flash_attention_forward(flash_shape(env, spec), acts.qr, acts.kr, acts.v, env.batch->docs, acts.o, acts.lse,
                                env.stream, sinks_f32(env, spec, w));
  Tensor y = env.bf16({T, env.cfg->hidden_size});
  project(env, spec.o_bias, acts.o, w.o_proj, w.o_bias, y);
  acts.uo = env.lora_forward(WeightSlot::o_proj, acts.o, y);
  return y;
}

void attention_acts_drop_cheap(AttentionActsCuda& acts) {
  acts.a = Tensor();
  acts.qr = Tensor();
  acts.kr = Tensor();
}

void attention_acts_restore(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                            const Tensor& x, AttentionActsCuda& acts) {
  env.phase(cuda::Phase::attention);
  if (!acts.a.defined()) {
    acts.a = env.bf16({env.tokens(), env.cfg->hidden_size});
    cuda::rmsnorm_forward(x, w.input_norm, env.eps(), acts.a, nullptr, env.stream, env.norm_round_once());
  }
  if (!acts.qr.defined()) acts.qr = norm_rope(env, spec, acts.q, w.q_norm, spec.heads);
  if (!acts.kr.defined()) acts.kr = norm_rope(env, spec, acts.k, w.k_norm, spec.kv_heads);
}

Tensor attention_block_backward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                     const AttentionActsCuda& acts, const Tensor& dy, LayerWeights& g,
                                     AttentionWgradsCuda* deferred) {
  const int64_t T = env.tokens(), D = spec.head_dim, Hq = spec.heads, Hkv = spec.kv_heads;
  const CudaRopeTable* rope = has_rope(spec) ? &env.batch->rope_table(spec) : nullptr;  // NoPE: no table
  env.phase(cuda::Phase::attention);
  Tensor d_o = env.bf16({T, Hq * D});
  cuda::linear_backward_input(dy, w.o_proj, d_o, env.stream);
  if (g.o_proj.defined()) cuda::linear_backward_weight(dy, acts.o, g.o_proj, env.stream);
  if (spec.o_bias && g.o_bias.defined()) cuda::bias_backward(dy, g.o_bias, env.stream);
  env.lora_backward(WeightSlot::o_proj, dy, acts.o, acts.uo, d_o);

  Tensor dqr, dkr, dv;
  // The Hopper kernel's fp32 dQ, read by the QK-norm + RoPE backward directly (without the QK-norm, RoPE's backward
  // reads the bf16 dq; without RoPE, the plain QK-norm backward or nothing does).
  cuda::FlashDqSums dq_sums;
  cuda::flash_attention_backward(flash_shape(env, spec), d_o, acts.qr, acts.kr, acts.v, acts.o, acts.lse,
                                 env.batch->docs, dqr, dkr, dv, env.stream,
                                 spec.qk_norm && rope ? &dq_sums : nullptr,
                                 env.deterministic ? cuda::FlashBwdMode::deterministic : cuda::FlashBwdMode::fast,
                                 sinks_f32(env, spec, w), spec.sinks && g.sinks.defined() ? &g.sinks : nullptr);
  d_o = Tensor();
  Tensor scratch_q, scratch_k;  // the QK-norm weights' discarded gradients when they are frozen
  Tensor& dq_norm = spec.qk_norm ? grad_or_scratch(env, g.q_norm, w.q_norm, scratch_q) : g.q_norm;
  Tensor& dk_norm = spec.qk_norm ? grad_or_scratch(env, g.k_norm, w.k_norm, scratch_k) : g.k_norm;

  // Through RoPE (the rotation's transpose) and the QK-norm where there is one, back to the projections. Without
  // either, the attention's gradient is the projection's.
  auto unrope_unnorm = [&](Tensor& dr, const Tensor& pre_norm, const Tensor& norm_w, Tensor& dnorm_w, int64_t heads) {
    if (!rope && !spec.qk_norm) return dr.view({T, heads * D});
    Tensor dpre = env.bf16({T, heads * D});
    Tensor dpre_rows = dpre.view({T * heads, D});
    if (!rope)
      cuda::rmsnorm_backward(dr.view({T * heads, D}), pre_norm.view({T * heads, D}), norm_w, env.eps(), dpre_rows,
                             dnorm_w, nullptr, env.stream);
    else if (spec.qk_norm)
      cuda::rmsnorm_rope_backward(dr.view({T * heads, D}), pre_norm.view({T * heads, D}), norm_w, env.eps(),
                                  rope->cos, rope->sin, dpre_rows, dnorm_w, env.stream);
    else
      cuda::rope_backward(dr.view({T * heads, D}), rope->cos, rope->sin, dpre_rows, env.stream);
    return dpre;
  };
  Tensor dq;
  if (dq_sums.acc.defined()) {
    dq = env.bf16({T, Hq * D});
    Tensor dq_rows = dq.view({T * Hq, D});
    cuda::rmsnorm_rope_backward_from_flash_dq(dq_sums, acts.q.view({T * Hq, D}), w.q_norm, env.eps(),
                                              rope->cos, rope->sin, dq_rows, dq_norm, env.stream);
    dq_sums = {};
  } else {
    dq = unrope_unnorm(dqr, acts.q, w.q_norm, dq_norm, Hq);
  }
  dqr = Tensor();
  Tensor dk = unrope_unnorm(dkr, acts.k, w.k_norm, dk_norm, Hkv);
  dkr = Tensor();

  Tensor da = env.bf16({T, env.cfg->hidden_size});
  cuda::linear_backward_input(dq, w.q_proj, da, env.stream, 0.0f);
  cuda::linear_backward_input(dk, w.k_proj, da, env.stream, 1.0f);
  cuda::linear_backward_input(dv, w.v_proj, da, env.stream, 1.0f);
  env.lora_backward(WeightSlot::q_proj, dq, acts.a, acts.uq, da);
  env.lora_backward(WeightSlot::k_proj, dk, acts.a, acts.uk, da);
  env.lora_backward(WeightSlot::v_proj, dv, acts.a, acts.uv, da);
  // A frozen projection's output gradient is not kept for a weight gradient.
  AttentionWgradsCuda wg{acts.a, g.q_proj.defined() ? dq : Tensor(), g.k_proj.defined() ? dk : Tensor(),
                         g.v_proj.defined() ? dv : Tensor(), spec.qkv_bias};
  if (deferred)
    *deferred = std::move(wg);
  else
    attention_block_wgrads_cuda(env, wg, g);
  return da;
}

void attention_block_wgrads_cuda(const CudaBlockEnv& env, AttentionWgradsCuda& d, LayerWeights& g) {
  env.phase(cuda::Phase::attention);
  if (d.dq.defined()) cuda::linear_backward_weight(d.dq, d.a, g.q_proj, env.stream);
  if (d.dk.defined()) cuda::linear_backward_weight(d.dk, d.a, g.k_proj, env.stream);
  if (d.dv.defined()) cuda::linear_backward_weight(d.dv, d.a, g.v_proj, env.stream);
  if (d.bias) {
    // The biases train with their projections or not at all (lora_base_grads leaves both undefined).
    if (d.dq.defined() && g.q_bias.defined()) cuda::bias_backward(d.dq, g.q_bias, env.stream);
    if (d.dk.defined() && g.k_bias.defined()) cuda::bias_backward(d.dk, g.k_bias, env.stream);
    if (d.dv.defined() && g.v_bias.defined()) cuda::bias_backward(d.dv, g.v_bias, env.stream);
  }
  d = {};
}

}  // namespace mt
