#include "layers/moe_block.h"

#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/relu2.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/router_sigmoid_group.h"
#include "kernels/cpu/swiglu.h"

namespace mt {

namespace {
cpu::SigmoidGroupRouting sigmoid_routing(const MoeSpec& spec) {
  cpu::SigmoidGroupRouting r;
  r.top_k = spec.experts_per_token;
  r.groups = spec.router.groups;
  r.topk_groups = spec.router.topk_groups;
  r.norm_topk_prob = spec.router.norm_topk_prob;
  r.scale = spec.router.scale;
  return r;
}

// The router's logits: DeepSeek-V3's linear runs in fp32 (F.linear(x.float(), W.float())) whatever the model dtype;
// the others as a linear of the model (bf16-rounded in bf16 mode), with the bias when it has one.
Tensor router_logits(const BlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& n) {
  if (spec.router.score == RouterScore::sigmoid_group) return cpu::linear_forward(n, w.router, /*bf16=*/false);
  return cpu::linear_forward(n, w.router, spec.router.linear_bias ? w.router_bias : Tensor(), env.bf16);
}

cpu::RouterOutput route(const BlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& logits) {
  switch (spec.router.score) {
    case RouterScore::topk_softmax: return cpu::router_topk_softmax_forward(logits, spec.experts_per_token, env.bf16);
    case RouterScore::sigmoid_group:
      return cpu::router_sigmoid_group_forward(logits, w.router_score_bias, sigmoid_routing(spec), env.bf16);
    case RouterScore::softmax_topk: break;
  }
  return cpu::router_forward(logits, spec.experts_per_token, spec.router.norm_topk_prob, env.bf16);
}

Tensor route_backward(const MoeSpec& spec, const Tensor& dweights, const cpu::RouterOutput& r) {
  switch (spec.router.score) {
    case RouterScore::topk_softmax: return cpu::router_topk_softmax_backward(dweights, r);
    case RouterScore::sigmoid_group: return cpu::router_sigmoid_group_backward(dweights, r, sigmoid_routing(spec));
    case RouterScore::softmax_topk: break;
  }
  return cpu::router_backward(dweights, r, spec.router.norm_topk_prob);
}

cpu::LoraRef lora_of(const LayerLora* l, int slot) { return l ? l->ref(slot) : cpu::LoraRef(); }
cpu::LoraGradRef dlora_of(LayerLora* l, int slot) { return l ? l->grad(slot) : cpu::LoraGradRef(); }

cpu::ExpertsVariant experts_variant(const MoeSpec& spec, const LayerWeights& w, const LayerLora* lora) {
  cpu::ExpertsVariant v;
  if (lora) {
    v.gate_up_lora = lora->ref(WeightSlot::experts_gate_up);
    v.down_lora = lora->ref(WeightSlot::experts_down);
  }
  v.activation = spec.expert.activation == Activation::swiglu_oai ? cpu::ExpertActivation::swiglu_oai
                 : spec.expert.activation == Activation::relu2    ? cpu::ExpertActivation::relu2
                                                                  : cpu::ExpertActivation::swiglu;
  if (spec.expert.bias) {
    v.gate_up_bias = &w.experts_gate_up_bias;
    v.down_bias = &w.experts_down_bias;
  }
  v.fp32_weights = spec.router.score == RouterScore::sigmoid_group;  // the router's weights stay fp32
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
  s.logits = router_logits(env, spec, w, s.n);
  s.route = route(env, spec, w, s.logits);
  const cpu::ExpertsVariant variant = experts_variant(spec, w, lora);
  refuse_ep_lora(env, variant);
  Tensor out = env.ep ? ep_experts_forward(*env.ep, s.n, s.route.index, s.route.weights, w.experts_gate_up,
                                          w.experts_down, env.bf16, &s.ep_experts, variant)
                     : cpu::experts_forward(s.n, s.route.index, s.route.weights, w.experts_gate_up, w.experts_down,
                                            env.bf16, &s.experts, variant);
  if (spec.shared_expert) {
    // DeepseekV3MoE / NemotronHMoE: experts(...) + shared_experts(residuals), a bf16 add of two bf16 tensors in a
    // bf16 model. The shared expert is SwiGLU (DeepSeek-V3) or ReLU² without a gate (Nemotron-H).
    using W = WeightSlot;
    const Tensor none;
    const bool relu2 = spec.shared_expert->activation == Activation::relu2;
    if (!relu2)
      s.shared_gate = cpu::lora_linear_forward(s.n, w.shared_gate, none, lora_of(lora, W::shared_gate), env.bf16);
    s.shared_up = cpu::lora_linear_forward(s.n, w.shared_up, none, lora_of(lora, W::shared_up), env.bf16);
    s.shared_act = relu2 ? cpu::relu2_forward(s.shared_up, env.bf16)
                         : cpu::swiglu_forward(s.shared_gate, s.shared_up, env.bf16);
    out = cpu::residual_add(
        out, cpu::lora_linear_forward(s.shared_act, w.shared_down, none, lora_of(lora, W::shared_down), env.bf16),
        env.bf16);
  }
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
  Tensor dlogits = route_backward(spec, dweights, s.route);
  if (dlogits_extra.defined()) cpu::add_inplace(dlogits, dlogits_extra);
  Tensor tmp = Tensor::empty(s.n.shape(), DType::F32);
  cpu::linear_backward(dlogits, s.n, w.router, &tmp, grad_of(g.router));
  if (spec.router.linear_bias) cpu::bias_backward(dlogits, g.router_bias);
  cpu::add_inplace(dn, tmp);
  if (spec.shared_expert) {  // its output joins the routed one: dy reaches it unchanged
    using W = WeightSlot;
    Tensor dact = Tensor::empty(s.shared_act.shape(), DType::F32);
    cpu::lora_linear_backward(dy, s.shared_act, w.shared_down, lora_of(lora, W::shared_down), &dact,
                              grad_of(g.shared_down), dlora_of(dlora, W::shared_down));
    Tensor dgate, dup;
    if (spec.shared_expert->activation == Activation::relu2) {
      dup = cpu::relu2_backward(dact, s.shared_up);
    } else {
      cpu::swiglu_backward(dact, s.shared_gate, s.shared_up, dgate, dup);
      cpu::lora_linear_backward(dgate, s.n, w.shared_gate, lora_of(lora, W::shared_gate), &tmp,
                                grad_of(g.shared_gate), dlora_of(dlora, W::shared_gate));
      cpu::add_inplace(dn, tmp);
    }
    cpu::lora_linear_backward(dup, s.n, w.shared_up, lora_of(lora, W::shared_up), &tmp, grad_of(g.shared_up),
                              dlora_of(dlora, W::shared_up));
    cpu::add_inplace(dn, tmp);
  }
  Tensor dh = cpu::rmsnorm_backward(dn, h, w.post_norm, env.eps(), g.post_norm);
  cpu::add_inplace(dh, dy);
  return dh;
}

}  // namespace mt
