#include "layers/cuda/mla_attention_block_cuda.h"

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_dims.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/lora.h"
#include "kernels/cuda/mla_assemble.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "layers/costs/attention_cost.h"  // mla_flash_value_dim
#include "layers/mla_attention_block.h"       // kMlaLatentNormEps

namespace mt {

namespace {

struct Dims {
  int64_t T, H, heads, nope, rope, D, Dv, Dvp, q_lora, kv_lora;
  int64_t ckv_w() const { return kv_lora + rope; }
};

Dims dims_of(const CudaBlockEnv& env, const AttentionSpec& a) {
  MT_CHECK(a.kind == AttentionKind::mla, "MLA block on a non-MLA attention spec");
  if (const std::string why = mla_cuda_unsupported_reason(a); !why.empty()) fail("MLA attention: {}", why);
  return {env.tokens(),     env.cfg->hidden_size, a.heads,       a.qk_nope_head_dim, a.qk_rope_head_dim,
          a.head_dim,       a.value_dim(),        mla_value_pad(a), a.q_lora_rank,    a.kv_lora_rank};
}

cuda::FlashAttentionShape flash_shape(const Dims& d, const AttentionSpec& spec) {
  cuda::FlashAttentionShape s{d.T, d.heads, d.heads, d.D};
  s.v_dim = d.Dvp == d.D ? 0 : d.Dvp;
  s.scale = static_cast<float>(spec.scale);
  return s;
}

cuda::MlaAssembleDims assemble_dims(const Dims& d, const AttentionSpec& spec) {
  cuda::MlaAssembleDims a;
  a.tokens = d.T;
  a.heads = d.heads;
  a.nope = d.nope;
  a.rope = d.rope;
  a.v_dim = d.Dv;
  a.v_pad = d.Dvp;
  a.interleaved = spec.rope.interleaved;
  return a;
}

// A frozen norm weight's gradient: a scratch buffer for the norm backward, which always adds one, discarded.
Tensor& grad_or_scratch(const CudaBlockEnv& env, Tensor& g, const Tensor& like, Tensor& scratch) {
  if (g.defined()) return g;
  scratch = Tensor::empty(like.shape(), DType::F32, env.dev());
  return scratch;
}

// y = x·Wᵀ (+ the slot's adapter into u).
Tensor project(const CudaBlockEnv& env, int slot, const Tensor& x, const Tensor& w, int64_t out, Tensor& u) {
  Tensor y = env.bf16({x.dim(0), out});
  cuda::linear_forward(x, w, y, env.stream);
  u = env.lora_forward(slot, x, y);
  return y;
}

// The projection's backward: dx (+)= dy·W (beta 1 adds into dx), dW += dyᵀ·x unless frozen, the adapter's.
void project_backward(const CudaBlockEnv& env, int slot, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& u, Tensor& dx, float beta, Tensor& dw) {
  cuda::linear_backward_input(dy, w, dx, env.stream, beta);
  if (dw.defined()) cuda::linear_backward_weight(dy, x, dw, env.stream);
  env.lora_backward(slot, dy, x, u, dx);
}

Tensor latent_norm(const CudaBlockEnv& env, const Tensor& x, const Tensor& w) {
  Tensor n = env.bf16(x.shape());
  cuda::rmsnorm_forward(x, w, kMlaLatentNormEps, n, nullptr, env.stream);
  return n;
}

// The cheap tensors from the kept ones: qan, kv_lat, kvn, query, key, value (those not present).
void assemble(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Dims& d,
              MlaActsCuda& s) {
  if (d.q_lora > 0 && !s.qan.defined()) s.qan = latent_norm(env, s.qa, w.q_a_norm);
  if (!s.kv_lat.defined()) {
    s.kv_lat = env.bf16({d.T, d.kv_lora});
    cuda::copy_columns(s.ckv, 0, s.kv_lat, 0, d.kv_lora, env.stream);
  }
  if (!s.kvn.defined()) s.kvn = latent_norm(env, s.kv_lat, w.kv_a_norm);
  if (!s.query.defined() || !s.key.defined() || !s.value.defined()) {
    const CudaRopeTable& rope = env.batch->rope_table(spec);
    s.query = env.bf16({d.T, d.heads, d.D});
    s.key = env.bf16({d.T, d.heads, d.D});
    s.value = env.bf16({d.T, d.heads, d.Dvp});
    cuda::mla_assemble_forward(assemble_dims(d, spec), s.q, s.ckv, s.kv, rope.cos, rope.sin, s.query, s.key, s.value,
                               env.stream);
  }
}

}  // namespace

int64_t mla_value_pad(const AttentionSpec& a) { return mla_flash_value_dim(a); }

std::string mla_cuda_unsupported_reason(const AttentionSpec& a) {
  if (a.qk_rope_head_dim <= 0 || a.qk_rope_head_dim % 2 != 0 || a.qk_rope_head_dim > cuda::kRopeMaxHeadDim)
    return fmt::format("qk_rope_head_dim {} must be even and in [2, {}]", a.qk_rope_head_dim, cuda::kRopeMaxHeadDim);
  if (a.kv_lora_rank <= 0) return fmt::format("kv_lora_rank {} must be positive", a.kv_lora_rank);
  if (mla_value_pad(a) == 0)
    return fmt::format("query/key head size {} with value head size {} has no flash-attention kernel ({}; or a "
                       "value head size up to the query's, with {})",
                       a.head_dim, a.value_dim(), cuda::flash_attention_mla_dims(), cuda::flash_attention_head_dims());
  return "";
}

Tensor mla_attention_block_forward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                        const Tensor& a, MlaActsCuda& s) {
  using W = WeightSlot;
  const Dims d = dims_of(env, spec);
  env.phase(cuda::Phase::attention);
  s = MlaActsCuda{};
  s.a = a;
  if (d.q_lora > 0) {
    s.qa = project(env, W::q_a_proj, a, w.q_a_proj, d.q_lora, s.uqa);
    s.qan = latent_norm(env, s.qa, w.q_a_norm);
    s.q = project(env, W::q_b_proj, s.qan, w.q_b_proj, d.heads * d.D, s.uqb);
  } else {
    s.q = project(env, W::q_proj, a, w.q_proj, d.heads * d.D, s.uq);
  }
  s.ckv = project(env, W::kv_a_proj, a, w.kv_a_proj, d.ckv_w(), s.ukva);
  s.kv_lat = env.bf16({d.T, d.kv_lora});
  cuda::copy_columns(s.ckv, 0, s.kv_lat, 0, d.kv_lora, env.stream);
  s.kvn = latent_norm(env, s.kv_lat, w.kv_a_norm);
  s.kv = project(env, W::kv_b_proj, s.kvn, w.kv_b_proj, d.heads * (d.nope + d.Dv), s.ukvb);
  assemble(env, spec, w, d, s);

  s.o = env.bf16({d.T, d.heads, d.Dvp});
  cuda::flash_attention_forward(flash_shape(d, spec), s.query, s.key, s.value, env.batch->docs, s.o, s.lse,
                                env.stream);
  if (d.Dvp == d.Dv) {
    s.o_flat = s.o.view({d.T, d.heads * d.Dv});
  } else {  // drop the padding columns (zero) for o_proj
    s.o_flat = env.bf16({d.T, d.heads * d.Dv});
    Tensor src = s.o.view({d.T * d.heads, d.Dvp}), dst = s.o_flat.view({d.T * d.heads, d.Dv});
    cuda::copy_columns(src, 0, dst, 0, d.Dv, env.stream);
  }
  Tensor y = env.bf16({d.T, d.H});
  cuda::linear_forward(s.o_flat, w.o_proj, y, env.stream);
  s.uo = env.lora_forward(W::o_proj, s.o_flat, y);
  return y;
}

void mla_acts_drop_cheap(MlaActsCuda& s) {
  s.a = Tensor();
  s.qan = Tensor();
  s.kv_lat = Tensor();
  s.kvn = Tensor();
  s.query = Tensor();
  s.key = Tensor();
  s.value = Tensor();
}

void mla_acts_restore(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Tensor& x,
                      MlaActsCuda& s) {
  const Dims d = dims_of(env, spec);
  env.phase(cuda::Phase::attention);
  if (!s.a.defined()) {
    s.a = env.bf16({d.T, d.H});
    cuda::rmsnorm_forward(x, w.input_norm, env.eps(), s.a, nullptr, env.stream, env.norm_round_once());
  }
  assemble(env, spec, w, d, s);
}

Tensor mla_attention_block_backward_cuda(const CudaBlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                         const MlaActsCuda& s, const Tensor& dy, LayerWeights& g) {
  using W = WeightSlot;
  const Dims d = dims_of(env, spec);
  MT_CHECK(s.a.defined() && s.q.defined() && s.ckv.defined() && s.kv_lat.defined() && s.kvn.defined() &&
               s.kv.defined() && s.query.defined() && s.key.defined() && s.value.defined() && s.o.defined() &&
               s.lse.defined() && (d.q_lora == 0 || (s.qa.defined() && s.qan.defined())),
           "MLA block backward: activations missing (restore the dropped ones first)");
  const CudaRopeTable& rope = env.batch->rope_table(spec);
  env.phase(cuda::Phase::attention);

  // o_proj, then flash attention's backward (on the padded value's width where there is padding).
  Tensor d_o = env.bf16({d.T, d.heads * d.Dv});
  project_backward(env, W::o_proj, dy, s.o_flat, w.o_proj, s.uo, d_o, 0.0f, g.o_proj);
  if (d.Dvp != d.Dv) {
    Tensor padded = env.bf16({d.T * d.heads, d.Dvp});
    cuda::fill_zero_async(padded, env.stream);
    Tensor src = d_o.view({d.T * d.heads, d.Dv});
    cuda::copy_columns(src, 0, padded, 0, d.Dv, env.stream);
    d_o = padded;
  }
  Tensor dquery, dkey, dvalue;
  cuda::flash_attention_backward(flash_shape(d, spec), d_o.view({d.T, d.heads, d.Dvp}), s.query, s.key, s.value,
                                 s.o, s.lse, env.batch->docs, dquery, dkey, dvalue, env.stream, nullptr,
                                 env.deterministic ? cuda::FlashBwdMode::deterministic : cuda::FlashBwdMode::fast);
  d_o = Tensor();

  // Back through the assembly: dq, dkv and the rope key's columns of dckv (the latent's come from its norm below).
  Tensor dq = env.bf16({d.T, d.heads * d.D}), dkv = env.bf16({d.T, d.heads * (d.nope + d.Dv)});
  Tensor dckv = env.bf16({d.T, d.ckv_w()});
  cuda::mla_assemble_backward(assemble_dims(d, spec), dquery, dkey, dvalue, rope.cos, rope.sin, dq, dkv, dckv,
                              env.stream);
  dquery = dkey = dvalue = Tensor();

  // kv_b_proj, kv_a_layernorm, kv_a_proj_with_mqa.
  Tensor scratch_kv, scratch_q;  // frozen norm weights' discarded gradients
  {
    Tensor dkvn = env.bf16({d.T, d.kv_lora});
    project_backward(env, W::kv_b_proj, dkv, s.kvn, w.kv_b_proj, s.ukvb, dkvn, 0.0f, g.kv_b_proj);
    dkv = Tensor();
    Tensor dlat = env.bf16({d.T, d.kv_lora});
    cuda::rmsnorm_backward(dkvn, s.kv_lat, w.kv_a_norm, kMlaLatentNormEps, dlat,
                           grad_or_scratch(env, g.kv_a_norm, w.kv_a_norm, scratch_kv), nullptr, env.stream);
    cuda::copy_columns(dlat, 0, dckv, 0, d.kv_lora, env.stream);
  }
  Tensor da = env.bf16({d.T, d.H});
  project_backward(env, W::kv_a_proj, dckv, s.a, w.kv_a_proj, s.ukva, da, 0.0f, g.kv_a_proj);
  dckv = Tensor();

  // The query path.
  if (d.q_lora > 0) {
    Tensor dqan = env.bf16({d.T, d.q_lora});
    project_backward(env, W::q_b_proj, dq, s.qan, w.q_b_proj, s.uqb, dqan, 0.0f, g.q_b_proj);
    dq = Tensor();
    Tensor dqa = env.bf16({d.T, d.q_lora});
    cuda::rmsnorm_backward(dqan, s.qa, w.q_a_norm, kMlaLatentNormEps, dqa,
                           grad_or_scratch(env, g.q_a_norm, w.q_a_norm, scratch_q), nullptr, env.stream);
    project_backward(env, W::q_a_proj, dqa, s.a, w.q_a_proj, s.uqa, da, 1.0f, g.q_a_proj);
  } else {
    project_backward(env, W::q_proj, dq, s.a, w.q_proj, s.uq, da, 1.0f, g.q_proj);
  }
  return da;
}

}  // namespace mt
