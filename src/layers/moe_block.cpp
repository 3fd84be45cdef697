#include "layers/moe_block.h"

#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"

namespace mt {

namespace {
cpu::ExpertsVariant experts_variant(const MoeSpec& spec, const LayerWeights& w, const LayerLora* lora) {
  cpu::ExpertsVariant v;
  if (lora) {
    v.gate_up_lora = lora->ref(WeightSlot::experts_gate_up);
    v.down_lora = lora->ref(WeightSlot::experts_down);
  }
  v.activation = spec.expert.activation == Activation::swiglu_oai ? cpu::ExpertActivation::swiglu_oai
                                                                  : cpu::ExpertActivation::swiglu;
  if (spec.expert.bias) {
    v.gate_up_bias = &w.experts_gate_up_bias;
    v.down_bias = &w.experts_down_bias;
  }
  return v;
}

Tensor* grad_of(Tensor& g) { return g.defined() ? &g : nullptr; }  // undefined: a frozen parameter

void refuse_ep_lora(const BlockEnv& env, const cpu::ExpertsVariant& v) {
  MT_CHECK(!env.ep || (!v.gate_up_lora.on() && !v.down_lora.on()),
           "LoRA adapters on experts under expert parallelism are not supported");
}
}  // namespace

Tensor moe_block_forward(const BlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& h,
                         MoeBlockActs* acts, const LayerLora* lora) {
  MoeBlockActs local;
  MoeBlockActs& s = acts ? *acts : local;
  s.n = cpu::rmsnorm_forward(h, w.post_norm, env.eps(), env.bf16, env.norm_rounds_once());
  s.logits = cpu::linear_forward(s.n, w.router, spec.router.linear_bias ? w.router_bias : Tensor(), env.bf16);
  s.route = spec.router.score == RouterScore::topk_softmax
                ? cpu::router_topk_softmax_forward(s.logits, spec.experts_per_token, env.bf16)
                : cpu::router_forward(s.logits, spec.experts_per_token, spec.router.norm_topk_prob, env.bf16);
  const cpu::ExpertsVariant variant = experts_variant(spec, w, lora);
  refuse_ep_lora(env, variant);
  Tensor out = env.ep ? ep_experts_forward(*env.ep, s.n, s.route.index, s.route.weights, w.experts_gate_up,
                                          w.experts_down, env.bf16, &s.ep_experts, variant)
                     : cpu::experts_forward(s.n, s.route.index, s.route.weights, w.experts_gate_up, w.experts_down,
                                            env.bf16, &s.experts, variant);
  return cpu::residual_add(h, out, env.bf16);
}

Tensor moe_block_backward(const BlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& h,
                          const MoeBlockActs& s, const Tensor& dy, const Tensor& dlogits_extra,
                          LayerWeights& g, const LayerLora* lora, LayerLora* dlora) {
  Tensor dn, dweights;
  const cpu::ExpertsVariant variant = experts_variant(spec, w, lora);
  refuse_ep_lora(env, variant);
  const cpu::ExpertsBiasGrads bias_grads{grad_of(g.experts_gate_up_bias), grad_of(g.experts_down_bias)};
  cpu::ExpertsLoraGrads lora_grads;
  if (dlora) {
    lora_grads.gate_up = dlora->grad(WeightSlot::experts_gate_up);
    lora_grads.down = dlora->grad(WeightSlot::experts_down);
  }
  if (env.ep)
    ep_experts_backward(*env.ep, dy, s.route.weights, w.experts_gate_up, w.experts_down, s.ep_experts, dn, dweights,
                        g.experts_gate_up, g.experts_down, variant, bias_grads);
  else
    cpu::experts_backward(dy, s.route.weights, w.experts_gate_up, w.experts_down, s.experts, dn, dweights,
                          g.experts_gate_up, g.experts_down, variant, bias_grads, lora_grads);
  Tensor dlogits = spec.router.score == RouterScore::topk_softmax
                       ? cpu::router_topk_softmax_backward(dweights, s.route)
                       : cpu::router_backward(dweights, s.route, spec.router.norm_topk_prob);
  if (dlogits_extra.defined()) cpu::add_inplace(dlogits, dlogits_extra);
  Tensor tmp = Tensor::empty(s.n.shape(), DType::F32);
  cpu::linear_backward(dlogits, s.n, w.router, &tmp, grad_of(g.router));
  if (spec.router.linear_bias) cpu::bias_backward(dlogits, g.router_bias);
  cpu::add_inplace(dn, tmp);
  Tensor dh = cpu::rmsnorm_backward(dn, h, w.post_norm, env.eps(), g.post_norm);
  cpu::add_inplace(dh, dy);
  return dh;
}

}  // namespace mt
