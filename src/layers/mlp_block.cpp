#include "layers/mlp_block.h"

#include "kernels/cpu/linear.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/relu2.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/swiglu.h"

namespace mt {

namespace {
cpu::LoraRef lora_of(const LayerLora* l, int slot) { return l ? l->ref(slot) : cpu::LoraRef(); }
cpu::LoraGradRef dlora_of(LayerLora* l, int slot) { return l ? l->grad(slot) : cpu::LoraGradRef(); }
Tensor* grad_of(Tensor& g) { return g.defined() ? &g : nullptr; }  // undefined: a frozen parameter
}  // namespace

Tensor mlp_block_forward(const BlockEnv& env, const MlpSpec& spec, const LayerWeights& w, const Tensor& h,
                         MlpBlockActs* acts, const LayerLora* lora) {
  using W = WeightSlot;
  MlpBlockActs local;
  MlpBlockActs& s = acts ? *acts : local;
  s.n = cpu::rmsnorm_forward(h, w.post_norm, env.eps(), env.bf16, env.norm_rounds_once());
  const bool relu2 = spec.activation == Activation::relu2;  // else SwiGLU (model_config_check)
  if (!relu2) s.gate = cpu::lora_linear_forward(s.n, w.mlp_gate, Tensor(), lora_of(lora, W::mlp_gate), env.bf16);
  s.up = cpu::lora_linear_forward(s.n, w.mlp_up, Tensor(), lora_of(lora, W::mlp_up), env.bf16);
  s.act = relu2 ? cpu::relu2_forward(s.up, env.bf16) : cpu::swiglu_forward(s.gate, s.up, env.bf16);
  Tensor out = cpu::lora_linear_forward(s.act, w.mlp_down, Tensor(), lora_of(lora, W::mlp_down), env.bf16);
  return cpu::residual_add(h, out, env.bf16);
}

Tensor mlp_block_backward(const BlockEnv& env, const MlpSpec& spec, const LayerWeights& w, const Tensor& h,
                          const MlpBlockActs& s, const Tensor& dy, LayerWeights& g, const LayerLora* lora,
                          LayerLora* dlora) {
  using W = WeightSlot;
  Tensor dact = Tensor::empty(s.act.shape(), DType::F32);
  cpu::lora_linear_backward(dy, s.act, w.mlp_down, lora_of(lora, W::mlp_down), &dact, grad_of(g.mlp_down),
                            dlora_of(dlora, W::mlp_down));
  Tensor dn = Tensor::empty(s.n.shape(), DType::F32);
  if (spec.activation == Activation::relu2) {
    cpu::lora_linear_backward(cpu::relu2_backward(dact, s.up), s.n, w.mlp_up, lora_of(lora, W::mlp_up), &dn,
                              grad_of(g.mlp_up), dlora_of(dlora, W::mlp_up));
  } else {
    Tensor dgate, dup, tmp = Tensor::empty(s.n.shape(), DType::F32);
    cpu::swiglu_backward(dact, s.gate, s.up, dgate, dup);
    cpu::lora_linear_backward(dgate, s.n, w.mlp_gate, lora_of(lora, W::mlp_gate), &dn, grad_of(g.mlp_gate),
                              dlora_of(dlora, W::mlp_gate));
    cpu::lora_linear_backward(dup, s.n, w.mlp_up, lora_of(lora, W::mlp_up), &tmp, grad_of(g.mlp_up),
                              dlora_of(dlora, W::mlp_up));
    cpu::add_inplace(dn, tmp);
  }
  Tensor dh = cpu::rmsnorm_backward(dn, h, w.post_norm, env.eps(), g.post_norm);
  cpu::add_inplace(dh, dy);
  return dh;
}

}  // namespace mt
