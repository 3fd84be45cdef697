#include "kernels/cpu/router_sigmoid_group.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

void check_sigmoid_group_routing(const SigmoidGroupRouting& r, int64_t E) {
  if (E < 1) fail("sigmoid group router: {} experts (n_routed_experts must be >= 1)", E);
  if (r.groups < 1 || E % r.groups != 0)
    fail("sigmoid group router: n_group {} does not divide n_routed_experts {}", r.groups, E);
  if (r.topk_groups < 1 || r.topk_groups > r.groups)
    fail("sigmoid group router: topk_group {} must be in 1..n_group ({})", r.topk_groups, r.groups);
  const int64_t per_group = E / r.groups, kept = r.topk_groups * per_group;
  if (r.topk_groups < r.groups && per_group < 2)
    fail("sigmoid group router: n_group {} leaves {} expert per group (the group score sums the top 2)", r.groups,
         per_group);
  if (r.top_k < 1 || r.top_k > kept)
    fail("sigmoid group router: num_experts_per_tok {} must be in 1..{} (topk_group {} of n_group {} keeps {} of {} "
         "experts)",
         r.top_k, kept, r.topk_groups, r.groups, kept, E);
  if (!std::isfinite(r.scale)) fail("sigmoid group router: routed_scaling_factor {} is not finite", r.scale);
}

namespace {

inline float sigmoid_f32(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// a ranks before b: NaN first, then the larger value (ties are decided by the caller's index order).
inline bool greater_nan_first(float a, float b) { return (std::isnan(a) && !std::isnan(b)) || a > b; }

}  // namespace

RouterOutput router_sigmoid_group_forward(const Tensor& logits, const Tensor& correction_bias,
                                          const SigmoidGroupRouting& r, bool /*bf16: the router is fp32 in HF*/) {
  MT_CHECK(logits.defined() && logits.ndim() == 2, "router logits must be [T, E], got {}",
           logits.defined() ? logits.desc() : "undefined");
  const int64_t T = logits.dim(0), E = logits.dim(1), k = r.top_k;
  check_f32(logits, "router logits", {T, E});
  check_sigmoid_group_routing(r, E);
  Tensor bias;
  if (correction_bias.defined()) {
    check_param(correction_bias, "e_score_correction_bias", {E});
    bias = param_f32(correction_bias);
  }
  RouterOutput out{Tensor::empty({T, E}, DType::F32), Tensor::empty({T, k}, DType::I32),
                   Tensor::empty({T, k}, DType::F32), Tensor::empty({T, k}, DType::F32)};
  const float* l = logits.data_as<float>();
  const float* b = bias.defined() ? bias.data_as<float>() : nullptr;
  float* s = out.probs.data_as<float>();
  int32_t* idx = out.index.data_as<int32_t>();
  float* val = out.value.data_as<float>();
  float* w = out.weights.data_as<float>();
  const int64_t G = r.groups, per_group = E / G;
  const bool grouped = r.topk_groups < G;
  const float scale = static_cast<float>(r.scale);
#pragma omp parallel for schedule(static) if ((T * E) >= kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> c(static_cast<size_t>(E));
    float* st = s + t * E;
    for (int64_t e = 0; e < E; ++e) {
      st[e] = sigmoid_f32(l[t * E + e]);
      c[e] = b ? st[e] + b[e] : st[e];
    }
    if (grouped) {
      // Group score: the sum of the group's two best c (torch's topk(2) values, NaN first), fp32.
      std::vector<float> gs(static_cast<size_t>(G));
      for (int64_t g = 0; g < G; ++g) {
        const float* cg = c.data() + g * per_group;
        float b1 = cg[0], b2 = cg[1];
        if (greater_nan_first(b2, b1)) std::swap(b1, b2);
        for (int64_t i = 2; i < per_group; ++i) {
          if (greater_nan_first(cg[i], b1))
            b2 = b1, b1 = cg[i];
          else if (greater_nan_first(cg[i], b2))
            b2 = cg[i];
        }
        gs[g] = b1 + b2;
      }
      std::vector<int32_t> keep(static_cast<size_t>(r.topk_groups));
      topk_row(gs.data(), G, r.topk_groups, keep.data());
      std::vector<char> kept(static_cast<size_t>(G), 0);
      for (int32_t g : keep) kept[g] = 1;
      for (int64_t e = 0; e < E; ++e)
        if (!kept[e / per_group]) c[e] = -INFINITY;
    }
    int32_t* it = idx + t * k;
    topk_row(c.data(), E, k, it);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += val[t * k + j] = st[it[j]];
    if (r.norm_topk_prob) {
      const float denom = sum + 1e-20f;
      for (int64_t j = 0; j < k; ++j) val[t * k + j] /= denom;
    }
    for (int64_t j = 0; j < k; ++j) w[t * k + j] = val[t * k + j] * scale;
  }
  return out;
}

Tensor router_sigmoid_group_backward(const Tensor& dweights, const RouterOutput& route, const SigmoidGroupRouting& r) {
  MT_CHECK(route.probs.defined() && route.probs.ndim() == 2 && route.index.defined() && route.index.ndim() == 2,
           "sigmoid group router backward needs the forward's probs [T, E] and index [T, k]");
  const int64_t T = route.probs.dim(0), E = route.probs.dim(1), k = route.index.dim(1);
  check_f32(route.probs, "router probs", {T, E});
  MT_CHECK(route.index.dtype() == DType::I32 && route.index.device().is_cpu() && route.index.dim(0) == T,
           "router index must be a CPU I32 [{}, k], got {}", T, route.index.desc());
  MT_CHECK(r.top_k == k, "router backward: top_k {} but the index has {} slots", r.top_k, k);
  check_f32(dweights, "router dweights", {T, k});
  Tensor dlogits = Tensor::zeros({T, E}, DType::F32);
  const float* s = route.probs.data_as<float>();
  const int32_t* idx = route.index.data_as<int32_t>();
  const float* dw = dweights.data_as<float>();
  float* dl = dlogits.data_as<float>();
  const float scale = static_cast<float>(r.scale);
  for (int64_t i = 0; i < T * k; ++i)
    MT_CHECK(idx[i] >= 0 && idx[i] < E, "router index {} at slot {} outside 0..{}", idx[i], i, E - 1);
#pragma omp parallel for schedule(static) if ((T * E) >= kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* it = idx + t * k;
    const float* st = s + t * E;
    // w_j = fl(scale)·v_j, v_j = s_j / D with D = Σ s + 1e-20 (norm), else v_j = s_j.
    // dv_j = scale·dw_j;  ds_j = (dv_j − Σ_i dv_i·v_i) / D  (norm), else dv_j;  dlogit = ds·(1 − s)·s.
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += st[it[j]];
    const float denom = sum + 1e-20f;
    double dot = 0.0;
    if (r.norm_topk_prob)
      for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(dw[t * k + j] * scale) * (st[it[j]] / denom);
    for (int64_t j = 0; j < k; ++j) {
      const float dv = dw[t * k + j] * scale;
      const float ds = r.norm_topk_prob ? (dv - static_cast<float>(dot)) / denom : dv;
      const float sj = st[it[j]];
      dl[t * E + it[j]] += ds * (1.0f - sj) * sj;
    }
  }
  return dlogits;
}

void router_expert_load_add(const Tensor& index, Tensor& load) {
  MT_CHECK(index.defined() && index.ndim() == 2 && index.dtype() == DType::I32 && index.device().is_cpu(),
           "expert load: index must be a CPU I32 [T, k], got {}", index.defined() ? index.desc() : "undefined");
  MT_CHECK(load.defined() && load.ndim() == 1 && load.dtype() == DType::I32 && load.device().is_cpu(),
           "expert load must be a CPU I32 [E], got {}", load.defined() ? load.desc() : "undefined");
  const int64_t E = load.dim(0), n = index.numel();
  const int32_t* idx = index.data_as<int32_t>();
  int32_t* c = load.data_as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    MT_CHECK(idx[i] >= 0 && idx[i] < E, "expert load: index {} at slot {} outside 0..{}", idx[i], i, E - 1);
    ++c[idx[i]];
  }
}

Tensor router_expert_load(const Tensor& index, int64_t experts) {
  MT_CHECK(experts >= 1, "expert load of {} experts", experts);
  Tensor load = Tensor::zeros({experts}, DType::I32);
  router_expert_load_add(index, load);
  return load;
}

}  // namespace mt::cpu
