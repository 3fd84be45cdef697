#include "layers/mla_attention_block.h"

#include <cstring>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

namespace mt {

namespace {

struct Dims {
  int64_t T, H, heads, nope, rope, D, Dv, q_lora, kv_lora;
};

Dims dims_of(const BlockEnv& env, const AttentionSpec& a) {
  MT_CHECK(a.kind == AttentionKind::mla, "MLA block on a {} attention spec", static_cast<int>(a.kind));
  MT_CHECK(a.head_dim == a.qk_nope_head_dim + a.qk_rope_head_dim && a.rope.rotary_dim == a.qk_rope_head_dim,
           "MLA spec: head_dim {} is not nope {} + rope {} (rotary_dim {})", a.head_dim, a.qk_nope_head_dim,
           a.qk_rope_head_dim, a.rope.rotary_dim);
  return {env.tokens(), env.spec->hidden_size, a.heads,         a.qk_nope_head_dim, a.qk_rope_head_dim,
          a.head_dim,   a.value_dim(),         a.q_lora_rank,   a.kv_lora_rank};
}

cpu::AttentionShape attention_shape(const BlockEnv& env, const AttentionSpec& a) {
  cpu::AttentionShape s{env.batch, env.seq, a.heads, a.heads, a.head_dim};
  s.v_dim = a.value_dim();
  s.scale = static_cast<float>(a.scale);
  return s;
}

cpu::LoraRef lora_of(const LayerLora* l, int slot) { return l ? l->ref(slot) : cpu::LoraRef(); }
cpu::LoraGradRef dlora_of(LayerLora* l, int slot) { return l ? l->grad(slot) : cpu::LoraGradRef(); }
Tensor* grad_of(Tensor& g) { return g.defined() ? &g : nullptr; }  // undefined: a frozen parameter

// Columns [from, from + n) of x viewed as [rows, width], as a new [rows, n] tensor.
Tensor take_cols(const Tensor& x, int64_t rows, int64_t width, int64_t from, int64_t n) {
  Tensor out = Tensor::empty({rows, n}, DType::F32);
  const float* src = x.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * n, src + r * width + from, sizeof(float) * n);
  return out;
}

// Columns [from, from + n) of dst viewed as [rows, width] = src [rows, n].
void put_cols(Tensor& dst, int64_t rows, int64_t width, int64_t from, const Tensor& src, int64_t n) {
  const float* s = src.data_as<float>();
  float* d = dst.data_as<float>();
  for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * width + from, s + r * n, sizeof(float) * n);
}

Tensor rope_fwd(const AttentionSpec& a, const Tensor& x, const cpu::RopeTables& t, bool bf16) {
  return a.rope.interleaved ? cpu::rope_interleaved_forward(x, t, bf16) : cpu::rope_forward(x, t, bf16);
}
Tensor rope_bwd(const AttentionSpec& a, const Tensor& dy, const cpu::RopeTables& t) {
  return a.rope.interleaved ? cpu::rope_interleaved_backward(dy, t) : cpu::rope_backward(dy, t);
}

}  // namespace

Tensor mla_project_rows(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Tensor& x,
                        MlaBlockActs& s, const LayerLora* lora) {
  using W = WeightSlot;
  const Dims d = dims_of(env, spec);
  const int64_t T = d.T, Hq = d.heads;
  const Tensor none;
  s.a = cpu::rmsnorm_forward(x, w.input_norm, env.eps(), env.bf16, env.norm_rounds_once());
  if (d.q_lora > 0) {
    s.qa = cpu::lora_linear_forward(s.a, w.q_a_proj, none, lora_of(lora, W::q_a_proj), env.bf16);
    s.qan = cpu::rmsnorm_forward(s.qa, w.q_a_norm, kMlaLatentNormEps, env.bf16);
    s.q = cpu::lora_linear_forward(s.qan, w.q_b_proj, none, lora_of(lora, W::q_b_proj), env.bf16);
  } else {
    s.q = cpu::lora_linear_forward(s.a, w.q_proj, none, lora_of(lora, W::q_proj), env.bf16);
  }
  s.ckv = cpu::lora_linear_forward(s.a, w.kv_a_proj, none, lora_of(lora, W::kv_a_proj), env.bf16);
  const int64_t ckv_w = d.kv_lora + d.rope;
  s.kv_lat = take_cols(s.ckv, T, ckv_w, 0, d.kv_lora);
  s.kvn = cpu::rmsnorm_forward(s.kv_lat, w.kv_a_norm, kMlaLatentNormEps, env.bf16);

  // RoPE on the rope dims of every query head and of the one shared rope key.
  const cpu::RopeTables& rope = env.rope.of(spec);
  const Tensor q_rot = rope_fwd(spec, take_cols(s.q, T * Hq, d.D, d.nope, d.rope), rope, env.bf16);
  // query = [q_nope | q_rot].
  s.query = s.q.clone().view({env.batch, env.seq, Hq, d.D});
  put_cols(s.query, T * Hq, d.D, d.nope, q_rot, d.rope);
  return rope_fwd(spec, take_cols(s.ckv, T, ckv_w, d.kv_lora, d.rope), rope, env.bf16);
}

void mla_keys_values(const AttentionSpec& spec, const Tensor& kv, const Tensor& k_rot, Tensor& key, Tensor& value) {
  const int64_t R = k_rot.dim(0), Hq = spec.heads, nope = spec.qk_nope_head_dim, rope = spec.qk_rope_head_dim;
  const int64_t D = spec.head_dim, Dv = spec.value_dim();
  MT_CHECK(kv.numel() == R * Hq * (nope + Dv) && k_rot.shape() == Shape({R, rope}),
           "MLA keys/values from kv {} and k_rot {} for {} heads of {} + {} (v {})", kv.desc(), k_rot.desc(), Hq,
           nope, rope, Dv);
  // key = [k_nope | k_rot on every head], value = kv's v columns.
  key = Tensor::empty({R, Hq, D}, DType::F32);
  put_cols(key, R * Hq, D, 0, take_cols(kv, R * Hq, nope + Dv, 0, nope), nope);
  const float* kr = k_rot.data_as<float>();
  float* kp = key.data_as<float>();
  for (int64_t t = 0; t < R; ++t)
    for (int64_t h = 0; h < Hq; ++h) std::memcpy(kp + (t * Hq + h) * D + nope, kr + t * rope, sizeof(float) * rope);
  value = take_cols(kv, R * Hq, nope + Dv, nope, Dv).view({R, Hq, Dv});
}

Tensor mla_attention_block_forward(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                   const Tensor& x, MlaBlockActs* acts, const LayerLora* lora) {
  using W = WeightSlot;
  const Dims d = dims_of(env, spec);
  const int64_t T = d.T, Hq = d.heads;
  MlaBlockActs local;
  MlaBlockActs& s = acts ? *acts : local;
  const Tensor none;
  const Tensor k_rot = mla_project_rows(env, spec, w, x, s, lora);
  s.kv = cpu::lora_linear_forward(s.kvn, w.kv_b_proj, none, lora_of(lora, W::kv_b_proj), env.bf16);
  Tensor key, value;
  mla_keys_values(spec, s.kv, k_rot, key, value);
  s.key = key.view({env.batch, env.seq, Hq, d.D});
  s.value = value.view({env.batch, env.seq, Hq, d.Dv});
  s.o = cpu::attention_forward(attention_shape(env, spec), s.query, s.key, s.value, env.doc_ids, env.bf16, s.lse);
  Tensor out = cpu::lora_linear_forward(s.o.view({T, Hq * d.Dv}), w.o_proj, none, lora_of(lora, W::o_proj), env.bf16);
  return cpu::residual_add(x, out, env.bf16);
}

Tensor mla_attention_block_backward(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                    const Tensor& x, const MlaBlockActs& s, const Tensor& dy, LayerWeights& g,
                                    const LayerLora* lora, LayerLora* dlora) {
  using W = WeightSlot;
  const Dims d = dims_of(env, spec);
  const int64_t T = d.T, Hq = d.heads, H = d.H;
  Tensor dout = Tensor::empty({T, Hq * d.Dv}, DType::F32);
  cpu::lora_linear_backward(dy, s.o.view({T, Hq * d.Dv}), w.o_proj, lora_of(lora, W::o_proj), &dout,
                            grad_of(g.o_proj), dlora_of(dlora, W::o_proj));
  Tensor dquery, dkey, dvalue;
  cpu::attention_backward(attention_shape(env, spec), dout.view(s.o.shape()), s.query, s.key, s.value, env.doc_ids,
                          s.lse, env.bf16, dquery, dkey, dvalue);
  const cpu::RopeTables& rope = env.rope.of(spec);

  // Query: dq = [dq_nope | rope'(dq_rot)].
  Tensor dq = dquery.clone().view({T, Hq * d.D});
  put_cols(dq, T * Hq, d.D, d.nope, rope_bwd(spec, take_cols(dquery, T * Hq, d.D, d.nope, d.rope), rope), d.rope);

  // Key and value: dkv = [dk_nope | dv] per head; the shared rope key gets the sum over heads.
  Tensor dkv = Tensor::empty({T, Hq * (d.nope + d.Dv)}, DType::F32);
  put_cols(dkv, T * Hq, d.nope + d.Dv, 0, take_cols(dkey, T * Hq, d.D, 0, d.nope), d.nope);
  put_cols(dkv, T * Hq, d.nope + d.Dv, d.nope, dvalue, d.Dv);
  Tensor dk_rot = Tensor::zeros({T, d.rope}, DType::F32);
  {
    const float* dk = dkey.data_as<float>();
    float* dr = dk_rot.data_as<float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t j = 0; j < d.rope; ++j) dr[t * d.rope + j] += dk[(t * Hq + h) * d.D + d.nope + j];
  }
  Tensor dkvn = Tensor::empty({T, d.kv_lora}, DType::F32);
  cpu::lora_linear_backward(dkv, s.kvn, w.kv_b_proj, lora_of(lora, W::kv_b_proj), &dkvn, grad_of(g.kv_b_proj),
                            dlora_of(dlora, W::kv_b_proj));
  const int64_t ckv_w = d.kv_lora + d.rope;
  Tensor dckv = Tensor::empty({T, ckv_w}, DType::F32);
  put_cols(dckv, T, ckv_w, 0, cpu::rmsnorm_backward(dkvn, s.kv_lat, w.kv_a_norm, kMlaLatentNormEps, g.kv_a_norm),
           d.kv_lora);
  put_cols(dckv, T, ckv_w, d.kv_lora, rope_bwd(spec, dk_rot, rope), d.rope);

  Tensor da = Tensor::empty({T, H}, DType::F32), tmp = Tensor::empty({T, H}, DType::F32);
  cpu::lora_linear_backward(dckv, s.a, w.kv_a_proj, lora_of(lora, W::kv_a_proj), &da, grad_of(g.kv_a_proj),
                            dlora_of(dlora, W::kv_a_proj));
  if (d.q_lora > 0) {
    Tensor dqan = Tensor::empty({T, d.q_lora}, DType::F32);
    cpu::lora_linear_backward(dq, s.qan, w.q_b_proj, lora_of(lora, W::q_b_proj), &dqan, grad_of(g.q_b_proj),
                              dlora_of(dlora, W::q_b_proj));
    const Tensor dqa = cpu::rmsnorm_backward(dqan, s.qa, w.q_a_norm, kMlaLatentNormEps, g.q_a_norm);
    cpu::lora_linear_backward(dqa, s.a, w.q_a_proj, lora_of(lora, W::q_a_proj), &tmp, grad_of(g.q_a_proj),
                              dlora_of(dlora, W::q_a_proj));
  } else {
    cpu::lora_linear_backward(dq, s.a, w.q_proj, lora_of(lora, W::q_proj), &tmp, grad_of(g.q_proj),
                              dlora_of(dlora, W::q_proj));
  }
  cpu::add_inplace(da, tmp);
  Tensor dx = cpu::rmsnorm_backward(da, x, w.input_norm, env.eps(), g.input_norm);
  cpu::add_inplace(dx, dy);
  return dx;
}

}  // namespace mt
