#include "layers/cuda/attention_block_cuda.h"

#include <utility>

#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rmsnorm.h"

namespace mt {

namespace {

cuda::FlashAttentionShape flash_shape(const CudaBlockEnv& env, const AttentionSpec& spec) {
  return {env.tokens(), spec.heads, spec.kv_heads, spec.head_dim};
}

// x [T, heads·D] -> rope(rms_norm over each head's D values), one pass
Tensor norm_rope(const CudaBlockEnv& env, const AttentionSpec& spec, const Tensor& x, const Tensor& norm_w,
                 int64_t heads) {
  const int64_t T = env.tokens(), D = spec.head_dim;
  const CudaRopeTable& rope = env.batch->rope_table(spec);
  Tensor n = env.bf16({T * heads, D});
  cuda::rmsnorm_rope_forward(x.view({T * heads, D}), norm_w, env.eps(), rope.cos, rope.sin, n, env.stream);
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
  cuda::linear_forward(a, w.q_proj, acts.q, env.stream);
  cuda::linear_forward(a, w.k_proj, acts.k, env.stream);
  cuda::linear_forward(a, w.v_proj, acts.v, env.stream);
  acts.qr = norm_rope(env, spec, acts.q, w.q_norm, Hq);
  acts.kr = norm_rope(env, spec, acts.k, w.k_norm, Hkv);
  acts.o = env.bf16({T, Hq * D});
  acts.lse = Tensor();
  cuda::flash_attention_forward(flash_shape(env, spec), acts.qr, acts.kr, acts.v, env.batch->docs, acts.o, acts.lse,
                                env.stream);
  Tensor y = env.bf16({T, env.cfg->hidden_size});
  cuda::linear_forward(acts.o, w.o_proj, y, env.stream);
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
    cuda::rmsnorm_forward(x, w.input_norm, env.eps(), acts.a, nullptr, env.stream);
  }
  if (!acts.qr.defined()) acts.qr = norm_rope(env, spec, acts.q, w.q_norm, spec.heads);
  if (!acts.kr.defined()) acts.kr = norm_rope(env, spec, acts.k, w.k_norm, spec.kv_heads);
}

Tensor attention_block_backward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                     const AttentionActsCuda& acts, const Tensor& dy, LayerWeights& g,
                                     AttentionWgradsCuda* deferred) {
  const int64_t T = env.tokens(), D = spec.head_dim, Hq = spec.heads, Hkv = spec.kv_heads;
  const CudaRopeTable& rope = env.batch->rope_table(spec);
  env.phase(cuda::Phase::attention);
  Tensor d_o = env.bf16({T, Hq * D});
  cuda::linear_backward_input(dy, w.o_proj, d_o, env.stream);
  cuda::linear_backward_weight(dy, acts.o, g.o_proj, env.stream);

  Tensor dqr, dkr, dv;
  cuda::FlashDqSums dq_sums;  // the Hopper kernel's fp32 dQ, read by the QK-norm + RoPE backward directly
  cuda::flash_attention_backward(flash_shape(env, spec), d_o, acts.qr, acts.kr, acts.v, acts.o, acts.lse,
                                 env.batch->docs, dqr, dkr, dv, env.stream, &dq_sums,
                                 env.deterministic ? cuda::FlashBwdMode::deterministic : cuda::FlashBwdMode::fast);
  d_o = Tensor();

  // Through RoPE (the rotation's transpose) and the QK-norm, back to the projections, one pass.
  auto unrope_unnorm = [&](Tensor& dr, const Tensor& pre_norm, const Tensor& norm_w, Tensor& dnorm_w, int64_t heads) {
    Tensor dpre = env.bf16({T, heads * D});
    Tensor dpre_rows = dpre.view({T * heads, D});
    cuda::rmsnorm_rope_backward(dr.view({T * heads, D}), pre_norm.view({T * heads, D}), norm_w, env.eps(),
                                rope.cos, rope.sin, dpre_rows, dnorm_w, env.stream);
    return dpre;
  };
  Tensor dq;
  if (dq_sums.acc.defined()) {
    dq = env.bf16({T, Hq * D});
    Tensor dq_rows = dq.view({T * Hq, D});
    cuda::rmsnorm_rope_backward_from_flash_dq(dq_sums, acts.q.view({T * Hq, D}), w.q_norm, env.eps(),
                                              rope.cos, rope.sin, dq_rows, g.q_norm, env.stream);
    dq_sums = {};
  } else {
    dq = unrope_unnorm(dqr, acts.q, w.q_norm, g.q_norm, Hq);
  }
  dqr = Tensor();
  Tensor dk = unrope_unnorm(dkr, acts.k, w.k_norm, g.k_norm, Hkv);
  dkr = Tensor();

  Tensor da = env.bf16({T, env.cfg->hidden_size});
  cuda::linear_backward_input(dq, w.q_proj, da, env.stream, 0.0f);
  cuda::linear_backward_input(dk, w.k_proj, da, env.stream, 1.0f);
  cuda::linear_backward_input(dv, w.v_proj, da, env.stream, 1.0f);
  AttentionWgradsCuda wg{acts.a, dq, dk, dv};
  if (deferred)
    *deferred = std::move(wg);
  else
    attention_block_wgrads_cuda(env, wg, g);
  return da;
}

void attention_block_wgrads_cuda(const CudaBlockEnv& env, AttentionWgradsCuda& d, LayerWeights& g) {
  env.phase(cuda::Phase::attention);
  cuda::linear_backward_weight(d.dq, d.a, g.q_proj, env.stream);
  cuda::linear_backward_weight(d.dk, d.a, g.k_proj, env.stream);
  cuda::linear_backward_weight(d.dv, d.a, g.v_proj, env.stream);
  d = {};
}

}  // namespace mt
