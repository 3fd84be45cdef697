#include "layers/cuda/mamba2_mixer_block_cuda.h"

#include "core/error.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/conv1d_causal.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mamba2_dt.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rmsnorm_gated.h"
#include "kernels/cuda/ssd_scan.h"

namespace mt {

namespace {

// proj's column blocks: z [0, Di), xBC [Di, Di + C), dt [Di + C, Di + C + nh).
struct ProjColumns {
  int64_t z = 0, xbc = 0, dt = 0;
};
ProjColumns proj_columns(const Mamba2Spec& m) { return {0, m.inner(), m.inner() + m.conv_dim()}; }

cuda::SsdScanShape scan_shape(const Mamba2Spec& m) { return {m.heads, m.head_dim, m.groups, m.state}; }

const Tensor& bias_or_none(bool on, const Tensor& b) {
  static const Tensor none;
  return on ? b : none;
}

void check_block(const Mamba2Spec& m, int64_t hidden, const LayerWeights& w) {
  MT_CHECK(m.heads >= 1 && m.head_dim >= 1 && m.groups >= 1 && m.heads % m.groups == 0 && m.state >= 1 &&
               m.conv_kernel >= 1 && m.inner() % m.groups == 0,
           "mamba2 block: {} heads x {}, {} groups, state {}, conv {}", m.heads, m.head_dim, m.groups, m.state,
           m.conv_kernel);
  const Shape in{m.in_proj_dim(), hidden}, out{hidden, m.inner()};
  MT_CHECK(w.mamba_in_proj.shape() == in && w.mamba_out_proj.shape() == out &&
               w.mamba_in_proj.dtype() == DType::BF16 && w.mamba_out_proj.dtype() == DType::BF16,
           "mamba2 block: expected BF16 in_proj {} and out_proj {}, found {}, {}", shape_str(in), shape_str(out),
           w.mamba_in_proj.desc(), w.mamba_out_proj.desc());
}

// The part of the forward after in_proj: act, dt, A, the scan's y (and states), g. proj must be set.
void forward_from_proj(const CudaBlockEnv& env, const Mamba2Spec& m, const LayerWeights& w, Mamba2ActsCuda& a,
                       bool scan) {
  const int64_t T = a.proj.dim(0);
  const ProjColumns col = proj_columns(m);
  const cuda::AttentionDocs& docs = env.batch->docs;
  a.act = env.bf16({T, m.conv_dim()});
  cuda::conv1d_causal_silu_forward(a.proj, col.xbc, w.mamba_conv_weight, bias_or_none(m.conv_bias, w.mamba_conv_bias),
                                   docs, a.act, env.stream);
  a.dt = Tensor::empty({T, m.heads}, DType::F32, env.dev());
  cuda::mamba2_dt_forward(a.proj, col.dt, w.mamba_dt_bias, m.time_step_min, a.dt, env.stream);
  a.A = Tensor::empty({m.heads}, DType::F32, env.dev());
  cuda::mamba2_a_forward(w.mamba_a_log, a.A, env.stream);
  if (scan) {
    const cuda::SsdScanShape s = scan_shape(m);
    a.y = Tensor::empty({T, m.inner()}, DType::F32, env.dev());
    const int64_t ns = cuda::ssd_scan_states_numel(s, T);
    a.states = ns > 0 ? Tensor::empty({ns}, DType::F32, env.dev()) : Tensor();
    cuda::ssd_scan_forward(s, a.act, a.dt, a.A, w.mamba_d, docs, a.y, a.states.defined() ? &a.states : nullptr,
                           env.stream);
  }
  a.g = env.bf16({T, m.inner()});
  cuda::rmsnorm_gated_forward(a.y, a.proj, col.z, w.mamba_norm, m.inner() / m.groups, static_cast<float>(m.norm_eps),
                              a.g, env.stream);
}

}  // namespace

Tensor mamba2_block_forward_cuda(const CudaBlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w,
                                 const Tensor& n, Mamba2ActsCuda& acts) {
  const int64_t H = env.cfg->hidden_size;
  check_block(spec, H, w);
  MT_CHECK(n.ndim() == 2 && n.dim(1) == H && n.dtype() == DType::BF16, "mamba2 block: input BF16 [T, {}], found {}", H,
           n.desc());
  const int64_t T = n.dim(0);
  env.phase(cuda::Phase::mamba);
  acts.n = n;
  acts.proj = env.bf16({T, spec.in_proj_dim()});
  if (spec.proj_bias)
    cuda::linear_forward_bias(n, w.mamba_in_proj, w.mamba_in_proj_bias, acts.proj, env.stream);
  else
    cuda::linear_forward(n, w.mamba_in_proj, acts.proj, env.stream);
  acts.u_in = env.lora_forward(WeightSlot::mamba_in_proj, n, acts.proj);
  forward_from_proj(env, spec, w, acts, /*scan=*/true);
  Tensor out = env.bf16({T, H});
  if (spec.proj_bias)
    cuda::linear_forward_bias(acts.g, w.mamba_out_proj, w.mamba_out_proj_bias, out, env.stream);
  else
    cuda::linear_forward(acts.g, w.mamba_out_proj, out, env.stream);
  return out;
}

void mamba2_acts_drop_cheap(Mamba2ActsCuda& acts) {
  acts.n = Tensor();
  acts.act = Tensor();
  acts.dt = Tensor();
  acts.A = Tensor();
  acts.g = Tensor();
}

void mamba2_acts_restore(const CudaBlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w, const Tensor& x,
                         Mamba2ActsCuda& acts) {
  MT_CHECK(acts.proj.defined() && acts.y.defined(),
           "mamba2 block: nothing to recompute from (in_proj's output and the scan's were not kept)");
  if (!acts.n.defined()) {
    env.phase(cuda::Phase::other);
    acts.n = env.bf16(x.shape());
    cuda::rmsnorm_forward(x, w.input_norm, env.eps(), acts.n, nullptr, env.stream, env.norm_round_once());
  }
  if (acts.act.defined() && acts.dt.defined() && acts.A.defined() && acts.g.defined()) return;
  env.phase(cuda::Phase::mamba);
  forward_from_proj(env, spec, w, acts, /*scan=*/false);  // the same kernels on the same inputs: the same bits
}

Tensor mamba2_block_backward_cuda(const CudaBlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w,
                                  const Mamba2ActsCuda& a, const Tensor& dy, LayerWeights& g) {
  const int64_t H = env.cfg->hidden_size;
  check_block(spec, H, w);
  MT_CHECK(a.n.defined() && a.proj.defined() && a.act.defined() && a.dt.defined() && a.A.defined() &&
               a.y.defined() && a.g.defined(),
           "mamba2 block: backward needs every activation (restore the dropped ones first)");
  const int64_t T = a.n.dim(0), Di = spec.inner();
  MT_CHECK(dy.ndim() == 2 && dy.dim(0) == T && dy.dim(1) == H && dy.dtype() == DType::BF16,
           "mamba2 block: output gradient BF16 [{}, {}], found {}", T, H, dy.desc());
  const ProjColumns col = proj_columns(spec);
  const cuda::AttentionDocs& docs = env.batch->docs;
  env.phase(cuda::Phase::mamba);

  // out_proj (never adapted: its LoRA target is refused): dg = dy·W_out; dW_out += dyᵀ·g unless frozen.
  Tensor dg = env.bf16({T, Di});
  cuda::linear_backward_input(dy, w.mamba_out_proj, dg, env.stream);
  if (g.mamba_out_proj.defined()) cuda::linear_backward_weight(dy, a.g, g.mamba_out_proj, env.stream);
  if (spec.proj_bias && g.mamba_out_proj_bias.defined()) cuda::bias_backward(dy, g.mamba_out_proj_bias, env.stream);

  // Every column of dproj is written below: z by the gated norm, xBC by the conv, dt by the time-step backward.
  Tensor dproj = env.bf16({T, spec.in_proj_dim()});
  Tensor dyscan = Tensor::empty({T, Di}, DType::F32, env.dev());
  cuda::rmsnorm_gated_backward(dg, a.y, a.proj, col.z, w.mamba_norm, Di / spec.groups, static_cast<float>(spec.norm_eps),
                               dyscan, dproj, col.z, g.mamba_norm, env.stream);
  dg = Tensor();

  // The scan: d(x | B | C) into dact, ddt, dA, dD.
  Tensor dact = env.bf16({T, spec.conv_dim()});
  Tensor ddt = Tensor::empty({T, spec.heads}, DType::F32, env.dev());
  Tensor dA = Tensor::empty({spec.heads}, DType::F32, env.dev());
  cuda::ssd_scan_backward(scan_shape(spec), a.act, a.dt, a.A, w.mamba_d, docs, dyscan,
                          a.states.defined() ? &a.states : nullptr, dact, ddt, dA, g.mamba_d, env.stream);
  dyscan = Tensor();
  cuda::mamba2_a_backward(dA, a.A, g.mamba_a_log, env.stream);
  cuda::mamba2_dt_backward(ddt, a.proj, col.dt, w.mamba_dt_bias, spec.time_step_min, dproj, col.dt, g.mamba_dt_bias,
                           env.stream);
  ddt = Tensor();
  Tensor no_bias_grad;  // a conv without bias has no gradient to add into
  cuda::conv1d_causal_silu_backward(dact, a.proj, col.xbc, w.mamba_conv_weight,
                                    bias_or_none(spec.conv_bias, w.mamba_conv_bias), docs, dproj, col.xbc,
                                    g.mamba_conv_weight, spec.conv_bias ? g.mamba_conv_bias : no_bias_grad,
                                    env.stream);
  dact = Tensor();

  // in_proj: dn = dproj·W_in (+ the adapter's); dW_in += dprojᵀ·n unless frozen.
  Tensor dn = env.bf16({T, H});
  cuda::linear_backward_input(dproj, w.mamba_in_proj, dn, env.stream);
  env.lora_backward(WeightSlot::mamba_in_proj, dproj, a.n, a.u_in, dn);
  if (g.mamba_in_proj.defined()) cuda::linear_backward_weight(dproj, a.n, g.mamba_in_proj, env.stream);
  if (spec.proj_bias && g.mamba_in_proj_bias.defined()) cuda::bias_backward(dproj, g.mamba_in_proj_bias, env.stream);
  return dn;
}

}  // namespace mt
