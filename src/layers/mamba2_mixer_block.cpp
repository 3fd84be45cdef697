#include "layers/mamba2_mixer_block.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/conv1d_causal.h"
#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rmsnorm_gated.h"
#include "kernels/cpu/seq_segments.h"
#include "kernels/cpu/ssd_scan.h"

namespace mt {

namespace {

Tensor* grad_of(Tensor& g) { return g.defined() ? &g : nullptr; }  // undefined: a frozen parameter
cpu::LoraRef lora_of(const LayerLora* l, int slot) { return l ? l->ref(slot) : cpu::LoraRef(); }
cpu::LoraGradRef dlora_of(LayerLora* l, int slot) { return l ? l->grad(slot) : cpu::LoraGradRef(); }

// Columns [c0, c0 + n) of a [T, width] tensor, as a new [T, n] one.
Tensor columns(const Tensor& t, int64_t c0, int64_t n) {
  const int64_t T = t.dim(0), width = t.dim(1);
  Tensor r = Tensor::empty({T, n}, DType::F32);
  const float* src = t.data_as<float>();
  float* dst = r.data_as<float>();
  for (int64_t i = 0; i < T; ++i) std::memcpy(dst + i * n, src + i * width + c0, sizeof(float) * n);
  return r;
}

// part [T, n] into columns [c0, c0 + n) of dst [T, width].
void put_columns(Tensor& dst, int64_t c0, const Tensor& part) {
  const int64_t T = dst.dim(0), width = dst.dim(1), n = part.numel() / T;
  const float* src = part.data_as<float>();
  float* d = dst.data_as<float>();
  for (int64_t i = 0; i < T; ++i) std::memcpy(d + i * width + c0, src + i * n, sizeof(float) * n);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch's softplus (beta 1, threshold 20): x above the threshold passes through.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

cpu::SsdShape ssd_shape(const Mamba2Spec& m) { return {m.heads, m.head_dim, m.groups, m.state, m.chunk}; }

void check_spec(const Mamba2Spec& m, const BlockEnv& env) {
  MT_CHECK(m.heads >= 1 && m.head_dim >= 1 && m.groups >= 1 && m.heads % m.groups == 0 && m.state >= 1 &&
               m.conv_kernel >= 1 && m.chunk >= 1,
           "mamba2 block: {} heads x {}, {} groups, state {}, conv {}, chunk {}", m.heads, m.head_dim, m.groups,
           m.state, m.conv_kernel, m.chunk);
  MT_CHECK(env.spec != nullptr, "mamba2 block without a model spec");
}

}  // namespace

Tensor mamba2_project_rows(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& x,
                           Mamba2BlockActs& s, const LayerLora* lora) {
  const int64_t Di = spec.inner(), Cd = spec.conv_dim();
  const Tensor none;
  s.n = cpu::rmsnorm_forward(x, w.input_norm, env.eps(), env.bf16, env.norm_rounds_once());
  const Tensor proj = cpu::lora_linear_forward(s.n, w.mamba_in_proj, spec.proj_bias ? w.mamba_in_proj_bias : none,
                                               lora_of(lora, WeightSlot::mamba_in_proj), env.bf16);
  s.z = columns(proj, 0, Di);
  s.xbc = columns(proj, Di, Cd);
  return columns(proj, Di + Cd, spec.heads);
}

void mamba2_conv_activations(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& dt_in,
                             Mamba2BlockActs& s) {
  const int64_t T = s.conv.dim(0), Di = spec.inner(), Cd = spec.conv_dim(), nh = spec.heads;
  const int64_t GN = spec.groups * spec.state;
  Tensor act = Tensor::empty({T, Cd}, DType::F32);
  {
    const float* c = s.conv.data_as<float>();
    float* a = act.data_as<float>();
    for (int64_t i = 0; i < T * Cd; ++i) a[i] = env.bf16 ? round_bf16(silu(c[i])) : silu(c[i]);
  }
  s.x = columns(act, 0, Di).view({T, nh, spec.head_dim});
  s.B = columns(act, Di, GN).view({T, spec.groups, spec.state});
  s.C = columns(act, Di + GN, GN).view({T, spec.groups, spec.state});
  // dt = clamp(softplus(dt + dt_bias), min = time_step_min): bf16 ops in a bf16 model (Transformers' torch path).
  const Tensor dt_bias = cpu::param_f32(w.mamba_dt_bias);
  s.dt_raw = Tensor::empty({T, nh}, DType::F32);
  s.dt = Tensor::empty({T, nh}, DType::F32);
  // torch.clamp on a bf16 tensor takes the bound in bf16.
  const float tmin =
      env.bf16 ? round_bf16(static_cast<float>(spec.time_step_min)) : static_cast<float>(spec.time_step_min);
  for (int64_t i = 0; i < T * nh; ++i) {
    float r = dt_in.data_as<float>()[i] + dt_bias.data_as<float>()[i % nh];
    if (env.bf16) r = round_bf16(r);
    float v = softplus(r);
    if (env.bf16) v = round_bf16(v);
    s.dt_raw.data_as<float>()[i] = r;
    s.dt.data_as<float>()[i] = v >= tmin ? v : tmin;
  }
  s.A = Tensor::empty({nh}, DType::F32);
  const Tensor a_log = cpu::param_f32(w.mamba_a_log);
  for (int64_t h = 0; h < nh; ++h) s.A.data_as<float>()[h] = -std::exp(a_log.data_as<float>()[h]);
}

Tensor mamba2_block_forward(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& x,
                            Mamba2BlockActs* acts, Tensor* final_state, const LayerLora* lora) {
  check_spec(spec, env);
  Mamba2BlockActs local;
  Mamba2BlockActs& s = acts ? *acts : local;
  const int64_t T = env.tokens(), Di = spec.inner();
  const Tensor none;
  const Tensor dt_in = mamba2_project_rows(env, spec, w, x, s, lora);
  const std::vector<cpu::SeqSegment> segs = cpu::document_segments(env.doc_ids, env.batch, env.seq);
  s.conv = cpu::conv1d_causal_forward(s.xbc, w.mamba_conv_weight, spec.conv_bias ? w.mamba_conv_bias : none, segs,
                                      env.bf16);
  mamba2_conv_activations(env, spec, w, dt_in, s);
  const cpu::SsdInputs in{s.x, s.dt, s.A, s.B, s.C, cpu::param_f32(w.mamba_d)};
  s.y = cpu::ssd_scan_chunked_forward(ssd_shape(spec), in, segs, final_state);
  s.g = cpu::rmsnorm_gated_forward(s.y.view({T, Di}), s.z, w.mamba_norm, Di / spec.groups,
                                   static_cast<float>(spec.norm_eps));
  if (env.bf16) cpu::round_bf16_inplace(s.g.data_as<float>(), s.g.numel());  // out_proj(scan_output.to(dtype))
  const Tensor out = cpu::lora_linear_forward(s.g, w.mamba_out_proj, spec.proj_bias ? w.mamba_out_proj_bias : none,
                                              lora_of(lora, WeightSlot::mamba_out_proj), env.bf16);
  return cpu::residual_add(x, out, env.bf16);
}

Tensor mamba2_block_backward(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& x,
                             const Mamba2BlockActs& s, const Tensor& dy, LayerWeights& g, const LayerLora* lora,
                             LayerLora* dlora) {
  check_spec(spec, env);
  const int64_t T = env.tokens(), H = env.spec->hidden_size, Di = spec.inner(), Cd = spec.conv_dim(),
                nh = spec.heads, GN = spec.groups * spec.state;
  // out_proj (the bf16 rounding of its input passes the gradient through).
  Tensor dgn = Tensor::empty({T, Di}, DType::F32);
  cpu::lora_linear_backward(dy, s.g, w.mamba_out_proj, lora_of(lora, WeightSlot::mamba_out_proj), &dgn,
                            grad_of(g.mamba_out_proj), dlora_of(dlora, WeightSlot::mamba_out_proj));
  if (spec.proj_bias) cpu::bias_backward(dy, g.mamba_out_proj_bias);
  // The gated norm.
  Tensor dyscan, dz;
  cpu::rmsnorm_gated_backward(dgn, s.y.view({T, Di}), s.z, w.mamba_norm, Di / spec.groups,
                              static_cast<float>(spec.norm_eps), dyscan, dz, g.mamba_norm);
  // The scan.
  const std::vector<cpu::SeqSegment> segs = cpu::document_segments(env.doc_ids, env.batch, env.seq);
  const cpu::SsdInputs in{s.x, s.dt, s.A, s.B, s.C, cpu::param_f32(w.mamba_d)};
  const cpu::SsdGrads sg =
      cpu::ssd_scan_chunked_backward(ssd_shape(spec), in, dyscan.view({T, nh, spec.head_dim}), segs);
  if (g.mamba_d.defined()) cpu::add_inplace(g.mamba_d, sg.dD);
  if (g.mamba_a_log.defined()) {  // A = −exp(A_log): dA/dA_log = A
    Tensor da_log = Tensor::empty({nh}, DType::F32);
    for (int64_t h = 0; h < nh; ++h)
      da_log.data_as<float>()[h] = sg.dA.data_as<float>()[h] * s.A.data_as<float>()[h];
    cpu::add_inplace(g.mamba_a_log, da_log);
  }
  // dt: through the clamp (torch passes the gradient where softplus >= time_step_min) and softplus' = sigmoid.
  Tensor ddt_in = Tensor::empty({T, nh}, DType::F32);
  {
    const float tmin =
        env.bf16 ? round_bf16(static_cast<float>(spec.time_step_min)) : static_cast<float>(spec.time_step_min);
    const float* ddt = sg.ddt.data_as<float>();
    const float* raw = s.dt_raw.data_as<float>();
    float* out = ddt_in.data_as<float>();
    for (int64_t i = 0; i < T * nh; ++i) {
      const float r = raw[i];
      float v = softplus(r);
      if (env.bf16) v = round_bf16(v);
      const float through = v >= tmin ? ddt[i] : 0.0f;
      out[i] = r > 20.0f ? through : through / (1.0f + std::exp(-r));
    }
    if (g.mamba_dt_bias.defined()) cpu::bias_backward(ddt_in, g.mamba_dt_bias);
  }
  // silu after the conv, then the conv.
  Tensor dact = Tensor::empty({T, Cd}, DType::F32);
  put_columns(dact, 0, sg.dx);
  put_columns(dact, Di, sg.dB);
  put_columns(dact, Di + GN, sg.dC);
  {
    const float* c = s.conv.data_as<float>();
    float* d = dact.data_as<float>();
    for (int64_t i = 0; i < T * Cd; ++i) {
      const float sig = 1.0f / (1.0f + std::exp(-c[i]));
      d[i] *= sig * (1.0f + c[i] * (1.0f - sig));  // silu'
    }
  }
  const Tensor dxbc = cpu::conv1d_causal_backward(dact, s.xbc, w.mamba_conv_weight, segs, grad_of(g.mamba_conv_weight),
                                                  spec.conv_bias ? grad_of(g.mamba_conv_bias) : nullptr);
  // in_proj: its output's three parts.
  Tensor dproj = Tensor::empty({T, spec.in_proj_dim()}, DType::F32);
  put_columns(dproj, 0, dz);
  put_columns(dproj, Di, dxbc);
  put_columns(dproj, Di + Cd, ddt_in);
  Tensor dn = Tensor::empty({T, H}, DType::F32);
  cpu::lora_linear_backward(dproj, s.n, w.mamba_in_proj, lora_of(lora, WeightSlot::mamba_in_proj), &dn,
                            grad_of(g.mamba_in_proj), dlora_of(dlora, WeightSlot::mamba_in_proj));
  if (spec.proj_bias) cpu::bias_backward(dproj, g.mamba_in_proj_bias);
  Tensor dx = cpu::rmsnorm_backward(dn, x, w.input_norm, env.eps(), g.input_norm);
  cpu::add_inplace(dx, dy);
  return dx;
}

}  // namespace mt
