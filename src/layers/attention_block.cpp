#include "layers/attention_block.h"

#include "kernels/cpu/attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

namespace mt {

namespace {
cpu::AttentionShape attention_shape(const BlockEnv& env, const AttentionSpec& a) {
  cpu::AttentionShape s{env.batch, env.seq, a.heads, a.kv_heads, a.head_dim};
  s.window = a.sliding_window;
  s.scale = static_cast<float>(a.scale);
  s.eager_bf16 = a.eager_bf16;
  return s;
}

const Tensor& bias_or_none(bool on, const Tensor& b) {
  static const Tensor none;
  return on ? b : none;
}

cpu::LoraRef lora_of(const LayerLora* l, int slot) { return l ? l->ref(slot) : cpu::LoraRef(); }
cpu::LoraGradRef dlora_of(LayerLora* l, int slot) { return l ? l->grad(slot) : cpu::LoraGradRef(); }
Tensor* grad_of(Tensor& g) { return g.defined() ? &g : nullptr; }  // undefined: a frozen parameter
}  // namespace

Tensor attention_block_forward(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Tensor& x,
                               AttentionBlockActs* acts, const LayerLora* lora) {
  using W = WeightSlot;
  const int64_t B = env.batch, S = env.seq, Hq = spec.heads, Hk = spec.kv_heads, D = spec.head_dim;
  AttentionBlockActs local;
  AttentionBlockActs& s = acts ? *acts : local;
  s.a = cpu::rmsnorm_forward(x, w.input_norm, env.eps(), env.bf16, env.norm_rounds_once());
  s.q = cpu::lora_linear_forward(s.a, w.q_proj, bias_or_none(spec.qkv_bias, w.q_bias), lora_of(lora, W::q_proj),
                                 env.bf16);
  s.k = cpu::lora_linear_forward(s.a, w.k_proj, bias_or_none(spec.qkv_bias, w.k_bias), lora_of(lora, W::k_proj),
                                 env.bf16);
  s.v = cpu::lora_linear_forward(s.a, w.v_proj, bias_or_none(spec.qkv_bias, w.v_bias), lora_of(lora, W::v_proj),
                                 env.bf16)
            .view({B, S, Hk, D});
  // QK-norm per head over head_dim, before RoPE (Qwen3); without it RoPE reads the projections.
  Tensor qn = spec.qk_norm ? cpu::rmsnorm_forward(s.q.view({B * S, Hq, D}), w.q_norm, env.eps(), env.bf16)
                           : s.q.view({B * S, Hq, D});
  Tensor kn = spec.qk_norm ? cpu::rmsnorm_forward(s.k.view({B * S, Hk, D}), w.k_norm, env.eps(), env.bf16)
                           : s.k.view({B * S, Hk, D});
  if (spec.rope.kind == RopeKind::none) {  // NoPE (Nemotron-H): the projections as they are
    s.qr = qn.view({B, S, Hq, D});
    s.kr = kn.view({B, S, Hk, D});
  } else {
    const cpu::RopeTables& rope = env.rope.of(spec);
    s.qr = cpu::rope_forward(qn, rope, env.bf16).view({B, S, Hq, D});
    s.kr = cpu::rope_forward(kn, rope, env.bf16).view({B, S, Hk, D});
  }
  s.o = cpu::attention_forward(attention_shape(env, spec), s.qr, s.kr, s.v, env.doc_ids, env.bf16, s.lse,
                               spec.sinks ? w.sinks : Tensor());
  Tensor out = cpu::lora_linear_forward(s.o.view({B * S, Hq * D}), w.o_proj, bias_or_none(spec.o_bias, w.o_bias),
                                        lora_of(lora, W::o_proj), env.bf16);
  return cpu::residual_add(x, out, env.bf16);
}

Tensor attention_block_backward(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w, const Tensor& x,
                                const AttentionBlockActs& s, const Tensor& dy, LayerWeights& g,
                                const LayerLora* lora, LayerLora* dlora) {
  using W = WeightSlot;
  const int64_t T = env.tokens(), Hq = spec.heads, Hk = spec.kv_heads, D = spec.head_dim;
  Tensor dout = Tensor::empty({T, Hq * D}, DType::F32);
  cpu::lora_linear_backward(dy, s.o.view({T, Hq * D}), w.o_proj, lora_of(lora, W::o_proj), &dout, grad_of(g.o_proj),
                            dlora_of(dlora, W::o_proj));
  if (spec.o_bias) cpu::bias_backward(dy, g.o_bias);
  Tensor dq, dk, dv;
  cpu::attention_backward(attention_shape(env, spec), dout.view(s.o.shape()), s.qr, s.kr, s.v, env.doc_ids, s.lse,
                          env.bf16, dq, dk, dv, spec.sinks ? w.sinks : Tensor(),
                          spec.sinks ? grad_of(g.sinks) : nullptr);
  const bool nope = spec.rope.kind == RopeKind::none;
  Tensor dqn = nope ? dq.view({T, Hq, D}) : cpu::rope_backward(dq.view({T, Hq, D}), env.rope.of(spec));
  Tensor dkn = nope ? dk.view({T, Hk, D}) : cpu::rope_backward(dk.view({T, Hk, D}), env.rope.of(spec));
  Tensor dqp = spec.qk_norm ? cpu::rmsnorm_backward(dqn, s.q.view({T, Hq, D}), w.q_norm, env.eps(), g.q_norm) : dqn;
  Tensor dkp = spec.qk_norm ? cpu::rmsnorm_backward(dkn, s.k.view({T, Hk, D}), w.k_norm, env.eps(), g.k_norm) : dkn;
  if (spec.qkv_bias) {
    cpu::bias_backward(dqp, g.q_bias);
    cpu::bias_backward(dkp, g.k_bias);
    cpu::bias_backward(dv, g.v_bias);
  }
  const int64_t H = env.spec->hidden_size;
  Tensor da = Tensor::empty({T, H}, DType::F32), tmp = Tensor::empty({T, H}, DType::F32);
  cpu::lora_linear_backward(dqp.view({T, Hq * D}), s.a, w.q_proj, lora_of(lora, W::q_proj), &da, grad_of(g.q_proj),
                            dlora_of(dlora, W::q_proj));
  cpu::lora_linear_backward(dkp.view({T, Hk * D}), s.a, w.k_proj, lora_of(lora, W::k_proj), &tmp, grad_of(g.k_proj),
                            dlora_of(dlora, W::k_proj));
  cpu::add_inplace(da, tmp);
  cpu::lora_linear_backward(dv.view({T, Hk * D}), s.a, w.v_proj, lora_of(lora, W::v_proj), &tmp, grad_of(g.v_proj),
                            dlora_of(dlora, W::v_proj));
  cpu::add_inplace(da, tmp);
  Tensor dx = cpu::rmsnorm_backward(da, x, w.input_norm, env.eps(), g.input_norm);
  cpu::add_inplace(dx, dy);
  return dx;
}

}  // namespace mt
