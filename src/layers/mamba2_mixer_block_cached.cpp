#include "layers/mamba2_mixer_block_cached.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm_gated.h"
#include "layers/mamba2_mixer_block.h"

namespace mt {

Mamba2Cache Mamba2Cache::create(const Mamba2Spec& spec) {
  MT_CHECK(spec.conv_kernel >= 1 && spec.heads >= 1 && spec.head_dim >= 1 && spec.state >= 1,
           "Mamba2 cache: conv {}, {} heads x {}, state {}", spec.conv_kernel, spec.heads, spec.head_dim, spec.state);
  return {Tensor::zeros({spec.conv_dim(), spec.conv_kernel - 1}, DType::F32),
          Tensor::zeros({spec.heads, spec.head_dim, spec.state}, DType::F32)};
}

int64_t Mamba2Cache::bytes() const {
  return ssm.defined() ? static_cast<int64_t>(conv.nbytes() + ssm.nbytes()) : 0;
}

namespace {

float maybe_bf16(float v, bool bf16) { return bf16 ? round_bf16(v) : v; }

// The conv of the rows of xbc [n, C], each at the end of the window, which then moves on by that row.
// Transformers' decode branch: torch.sum(conv_state * weight, -1) (+= bias), in the model dtype.
Tensor conv_steps(const Tensor& xbc, const Tensor& weight, const Tensor& bias, bool bf16, Tensor& window) {
  const int64_t n = xbc.dim(0), C = xbc.dim(1), K = weight.dim(2), W = K - 1;
  const Tensor wf = cpu::param_f32(weight), bf = bias.defined() ? cpu::param_f32(bias) : Tensor();
  const float* wp = wf.data_as<float>();
  const float* bp = bf.defined() ? bf.data_as<float>() : nullptr;
  const float* xp = xbc.data_as<float>();
  float* win = window.data_as<float>();
  Tensor out = Tensor::empty({n, C}, DType::F32);
  float* op = out.data_as<float>();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < C; ++c) {
      float* wc = win + c * W;
      const float xt = xp[t * C + c];
      float acc = 0.0f;
      for (int64_t j = 0; j < W; ++j) acc += maybe_bf16(wp[c * K + j] * wc[j], bf16);
      acc += maybe_bf16(wp[c * K + W] * xt, bf16);
      acc = maybe_bf16(acc, bf16);
      if (bp) acc = maybe_bf16(acc + bp[c], bf16);
      op[t * C + c] = acc;
      if (W > 0) {
        std::copy(wc + 1, wc + W, wc);
        wc[W - 1] = xt;
      }
    }
  return out;
}

// One token per row through the recurrence, in Transformers' decode order: dA = exp(dt·A), dBx = (dt·B)·x,
// S = S·dA + dBx, y = S·C + D·x. ssm [heads, P, N] advances; returns y F32 [n, heads, P].
Tensor scan_steps(const Mamba2Spec& spec, const Mamba2BlockActs& s, const Tensor& D, bool bf16, Tensor& ssm) {
  const int64_t n = s.x.dim(0), H = spec.heads, P = spec.head_dim, G = spec.groups, N = spec.state,
                per_group = H / G;
  const float* xp = s.x.data_as<float>();
  const float* dtp = s.dt.data_as<float>();
  const float* Ap = s.A.data_as<float>();
  const float* Bp = s.B.data_as<float>();
  const float* Cp = s.C.data_as<float>();
  const float* Dp = D.data_as<float>();
  float* Sp = ssm.data_as<float>();
  Tensor y = Tensor::empty({n, H, P}, DType::F32);
  float* yp = y.data_as<float>();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float dt = dtp[t * H + h], dA = std::exp(dt * Ap[h]);
      const float* B = Bp + (t * G + h / per_group) * N;
      const float* C = Cp + (t * G + h / per_group) * N;
      for (int64_t p = 0; p < P; ++p) {
        const float x = xp[(t * H + h) * P + p];
        float* S = Sp + (h * P + p) * N;
        float acc = 0.0f;
        for (int64_t k = 0; k < N; ++k) {
          const float dBx = maybe_bf16(maybe_bf16(dt * B[k], bf16) * x, bf16);
          S[k] = S[k] * dA + dBx;
          acc += maybe_bf16(S[k], bf16) * C[k];
        }
        yp[(t * H + h) * P + p] = maybe_bf16(maybe_bf16(acc, bf16) + maybe_bf16(x * Dp[h], bf16), bf16);
      }
    }
  return y;
}

}  // namespace

Tensor mamba2_block_forward_cached(const BlockEnv& env, const Mamba2Spec& spec, const LayerWeights& w,
                                   const Tensor& x, int64_t offset, Mamba2Cache& cache) {
  const int64_t n = env.tokens(), Di = spec.inner(), K = spec.conv_kernel;
  MT_CHECK(env.batch == 1 && !env.doc_ids.defined(), "cached Mamba2 runs one sequence, batch is {}", env.batch);
  MT_CHECK(cache.conv.shape() == Shape({spec.conv_dim(), K - 1}) &&
               cache.ssm.shape() == Shape({spec.heads, spec.head_dim, spec.state}),
           "Mamba2 cache {} / {} for conv_dim {}, kernel {}, {} heads x {}, state {}", cache.conv.desc(),
           cache.ssm.desc(), spec.conv_dim(), K, spec.heads, spec.head_dim, spec.state);
  MT_CHECK(offset >= 0 && n >= 1, "cached Mamba2: {} rows at offset {}", n, offset);
  if (offset == 0) {
    // The prompt: the training block, keeping the chunked scan's final state and the last K−1 conv inputs.
    Mamba2BlockActs s;
    Tensor state;
    Tensor y = mamba2_block_forward(env, spec, w, x, &s, &state);
    cache.ssm.copy_from(state);
    const int64_t C = spec.conv_dim(), W = K - 1;
    float* win = cache.conv.data_as<float>();
    const float* xp = s.xbc.data_as<float>();
    for (int64_t c = 0; c < C; ++c)
      for (int64_t j = 0; j < W; ++j) {
        const int64_t t = n - W + j;
        win[c * W + j] = t >= 0 ? xp[t * C + c] : 0.0f;
      }
    return y;
  }
  // Rows after the prompt: one token at a time against the cache.
  Mamba2BlockActs s;
  const Tensor none;
  const Tensor dt_in = mamba2_project_rows(env, spec, w, x, s);
  s.conv = conv_steps(s.xbc, w.mamba_conv_weight, spec.conv_bias ? w.mamba_conv_bias : none, env.bf16, cache.conv);
  mamba2_conv_activations(env, spec, w, dt_in, s);
  s.y = scan_steps(spec, s, cpu::param_f32(w.mamba_d), env.bf16, cache.ssm);
  s.g = cpu::rmsnorm_gated_forward(s.y.view({n, Di}), s.z, w.mamba_norm, Di / spec.groups,
                                   static_cast<float>(spec.norm_eps), env.bf16);
  const Tensor out = cpu::linear_forward(s.g, w.mamba_out_proj, spec.proj_bias ? w.mamba_out_proj_bias : none,
                                         env.bf16);
  return cpu::residual_add(x, out, env.bf16);
}

}  // namespace mt
