#include "layers/mlp_block.h"

#include "kernels/cpu/linear.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/swiglu.h"

namespace mt {

Tensor mlp_block_forward(const BlockEnv& env, const MlpSpec& /*SwiGLU (model_config_check)*/, const LayerWeights& w,
                         const Tensor& h, MlpBlockActs* acts) {
  MlpBlockActs local;
  MlpBlockActs& s = acts ? *acts : local;
  s.n = cpu::rmsnorm_forward(h, w.post_norm, env.eps(), env.bf16, env.norm_rounds_once());
  s.gate = cpu::linear_forward(s.n, w.mlp_gate, env.bf16);
  s.up = cpu::linear_forward(s.n, w.mlp_up, env.bf16);
  s.act = cpu::swiglu_forward(s.gate, s.up, env.bf16);
  Tensor out = cpu::linear_forward(s.act, w.mlp_down, env.bf16);
  return cpu::residual_add(h, out, env.bf16);
}

Tensor mlp_block_backward(const BlockEnv& env, const MlpSpec& /*SwiGLU*/, const LayerWeights& w, const Tensor& h,
                          const MlpBlockActs& s, const Tensor& dy, LayerWeights& g) {
  Tensor dact = Tensor::empty(s.act.shape(), DType::F32);
  cpu::linear_backward(dy, s.act, w.mlp_down, &dact, &g.mlp_down);
  Tensor dgate, dup;
  cpu::swiglu_backward(dact, s.gate, s.up, dgate, dup);
  Tensor dn = Tensor::empty(s.n.shape(), DType::F32), tmp = Tensor::empty(s.n.shape(), DType::F32);
  cpu::linear_backward(dgate, s.n, w.mlp_gate, &dn, &g.mlp_gate);
  cpu::linear_backward(dup, s.n, w.mlp_up, &tmp, &g.mlp_up);
  cpu::add_inplace(dn, tmp);
  Tensor dh = cpu::rmsnorm_backward(dn, h, w.post_norm, env.eps(), g.post_norm);
  cpu::add_inplace(dh, dy);
  return dh;
}

}  // namespace mt
