#include "kernels/cpu/experts.h"

#include <cstring>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/relu2.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/swiglu_oai.h"

namespace mt::cpu {

namespace {
struct Dims {
  int64_t T, k, E, H, I;
  int64_t F;  // the first projection's rows: 2I (gate | up) or I (up alone)
};

bool gated(const ExpertsVariant& v) { return v.activation != ExpertActivation::relu2; }

Dims check_dims(const Tensor& gate_up, const Tensor& down, const Tensor& weights, const ExpertsVariant& v) {
  MT_CHECK(gate_up.ndim() == 3 && down.ndim() == 3, "experts weights {} / {}", gate_up.desc(), down.desc());
  MT_CHECK(weights.ndim() == 2, "experts routing weights {}", weights.desc());
  const int64_t I = gated(v) ? gate_up.dim(1) / 2 : gate_up.dim(1);
  Dims d{weights.dim(0), weights.dim(1), gate_up.dim(0), gate_up.dim(2), I, gated(v) ? 2 * I : I};
  check_param(gate_up, "experts gate_up", {d.E, d.F, d.H});
  check_param(down, "experts down", {d.E, d.H, d.I});
  check_f32(weights, "experts routing weights", {d.T, d.k});
  MT_CHECK((v.gate_up_bias == nullptr) == (v.down_bias == nullptr), "experts: both biases or neither");
  if (v.gate_up_bias) {
    check_param(*v.gate_up_bias, "experts gate_up bias", {d.E, d.F});
    check_param(*v.down_bias, "experts down bias", {d.E, d.H});
  }
  return d;
}

// The rank of an expert-stacked adapter (A [E, r, in], B [E, out, r]), checked; 0 when off.
int64_t lora_rank(const LoraRef& l, int64_t E, int64_t in, int64_t out, const char* what) {
  if (!l.on()) return 0;
  MT_CHECK(l.b && l.a->ndim() == 3 && l.b->ndim() == 3, "experts {} adapter {} / {}", what, l.a->desc(),
           l.b ? l.b->desc() : "none");
  const int64_t r = l.a->dim(1);
  check_f32(*l.a, "experts adapter A", {E, r, in});
  check_f32(*l.b, "experts adapter B", {E, out, r});
  return r;
}

void check_lora_grads(const LoraRef& l, const LoraGradRef& g) {
  if (!l.on()) return;
  MT_CHECK(g.a && g.b, "experts backward: adapter gradients missing");
  check_f32(*g.a, "experts adapter dA", l.a->shape());
  check_f32(*g.b, "experts adapter dB", l.b->shape());
}

// rows += bias (one row of n), rounded in bf16 mode.
void add_bias_rows(float* rows, int64_t cnt, int64_t n, const float* bias, bool bf16) {
  for (int64_t r = 0; r < cnt; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const float v = rows[r * n + i] + bias[i];
      rows[r * n + i] = bf16 ? round_bf16(v) : v;
    }
}

// dbias += Σ over rows.
void sum_rows_into(const float* rows, int64_t cnt, int64_t n, float* dbias) {
  for (int64_t r = 0; r < cnt; ++r)
    for (int64_t i = 0; i < n; ++i) dbias[i] += rows[r * n + i];
}
}  // namespace

Tensor experts_forward(const Tensor& x, const Tensor& index, const Tensor& weights, const Tensor& gate_up,
                       const Tensor& down, bool bf16, ExpertsSaved* saved, const ExpertsVariant& variant) {
  const Dims d = check_dims(gate_up, down, weights, variant);
  const int64_t T = d.T, k = d.k, E = d.E, H = d.H, I = d.I, F = d.F, N = T * k;
  check_f32(x, "experts input", {T, H});
  MT_CHECK(index.dtype() == DType::I32 && index.shape() == Shape({T, k}), "experts index {}", index.desc());
  ExpertsSaved local;
  ExpertsSaved& s = saved ? *saved : local;
  const int32_t* idx = index.data_as<int32_t>();
  for (int64_t i = 0; i < N; ++i)
    MT_CHECK(idx[i] >= 0 && idx[i] < E, "expert index {} outside [0, {})", idx[i], E);

  // Counting sort of the slots by expert, stable in slot order.
  s.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < N; ++i) s.offsets[idx[i] + 1]++;
  for (int64_t e = 0; e < E; ++e) s.offsets[e + 1] += s.offsets[e];
  s.slot.assign(static_cast<size_t>(N), 0);
  s.row.assign(static_cast<size_t>(N), 0);
  std::vector<int64_t> fill(s.offsets.begin(), s.offsets.end() - 1);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r = fill[idx[i]]++;
    s.slot[r] = static_cast<int32_t>(i);
    s.row[i] = static_cast<int32_t>(r);
  }

  s.xg = Tensor::empty({N, H}, DType::F32);
  s.gate_up = Tensor::empty({N, F}, DType::F32);
  s.act = Tensor::empty({N, I}, DType::F32);
  s.y = Tensor::empty({N, H}, DType::F32);
  const float* xp = x.data_as<float>();
  float* xg = s.xg.data_as<float>();
#pragma omp parallel for schedule(static) if ((N * H) >= kParallelMinWork)
  for (int64_t r = 0; r < N; ++r) std::memcpy(xg + r * H, xp + (s.slot[r] / k) * H, sizeof(float) * H);

  float* gu = s.gate_up.data_as<float>();
  float* act = s.act.data_as<float>();
  float* y = s.y.data_as<float>();
  const Tensor b1 = variant.gate_up_bias ? param_f32(*variant.gate_up_bias) : Tensor();
  const Tensor b2 = variant.down_bias ? param_f32(*variant.down_bias) : Tensor();
  const LoraRef& lora1 = variant.gate_up_lora;
  const LoraRef& lora2 = variant.down_lora;
  const int64_t r1 = lora_rank(lora1, E, H, F, "gate_up"), r2 = lora_rank(lora2, E, I, H, "down");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = s.offsets[e], cnt = s.offsets[e + 1] - r0;
    if (cnt == 0) continue;
    Tensor w1 = param_f32(gate_up[e]);
    Tensor w2 = param_f32(down[e]);
    gemm_nt(cnt, F, H, 1.0f, xg + r0 * H, H, w1.data_as<float>(), H, 0.0f, gu + r0 * F, F);
    if (lora1.on())
      lora_forward_rows(cnt, H, F, r1, xg + r0 * H, H, lora1.a->data_as<float>() + e * r1 * H,
                        lora1.b->data_as<float>() + e * F * r1, lora1.scale, gu + r0 * F, F);
    if (bf16) round_bf16_inplace(gu + r0 * F, cnt * F);
    if (b1.defined()) add_bias_rows(gu + r0 * F, cnt, F, b1.data_as<float>() + e * F, bf16);
    if (variant.activation == ExpertActivation::swiglu_oai)
      swiglu_oai_forward_rows(cnt, I, gu + r0 * F, gu + r0 * F + I, F, act + r0 * I, I, bf16);
    else if (variant.activation == ExpertActivation::relu2)
      relu2_forward_rows(cnt, I, gu + r0 * F, F, act + r0 * I, I, bf16);
    else
      swiglu_forward_rows(cnt, I, gu + r0 * F, gu + r0 * F + I, F, act + r0 * I, I, bf16);
    gemm_nt(cnt, H, I, 1.0f, act + r0 * I, I, w2.data_as<float>(), I, 0.0f, y + r0 * H, H);
    if (lora2.on())
      lora_forward_rows(cnt, I, H, r2, act + r0 * I, I, lora2.a->data_as<float>() + e * r2 * I,
                        lora2.b->data_as<float>() + e * H * r2, lora2.scale, y + r0 * H, H);
    if (bf16) round_bf16_inplace(y + r0 * H, cnt * H);
    if (b2.defined()) add_bias_rows(y + r0 * H, cnt, H, b2.data_as<float>() + e * H, bf16);
  }

  Tensor out = Tensor::empty({T, H}, DType::F32);
  float* op = out.data_as<float>();
  const float* wp = weights.data_as<float>();
  const bool round_product = bf16 && !variant.fp32_weights;
#pragma omp parallel for schedule(static) if ((T * H * k) >= kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    float* o = op + t * H;
    for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float w = wp[t * k + j];
      const float* yr = y + static_cast<int64_t>(s.row[t * k + j]) * H;
      for (int64_t h = 0; h < H; ++h) o[h] += round_product ? round_bf16(yr[h] * w) : yr[h] * w;
    }
    if (bf16)
      for (int64_t h = 0; h < H; ++h) o[h] = round_bf16(o[h]);
  }
  return out;
}

void experts_backward(const Tensor& dout, const Tensor& weights, const Tensor& gate_up, const Tensor& down,
                      const ExpertsSaved& s, Tensor& dx, Tensor& dweights, Tensor& dgate_up, Tensor& ddown,
                      const ExpertsVariant& variant, const ExpertsBiasGrads& bias_grads,
                      const ExpertsLoraGrads& lora_grads) {
  const Dims d = check_dims(gate_up, down, weights, variant);
  // A bias gradient left null, or an undefined weight gradient, is a frozen parameter: not computed.
  float* dbias1 = variant.gate_up_bias && bias_grads.gate_up_bias ? bias_grads.gate_up_bias->data_as<float>() : nullptr;
  float* dbias2 = variant.down_bias && bias_grads.down_bias ? bias_grads.down_bias->data_as<float>() : nullptr;
  if (dbias1) check_f32(*bias_grads.gate_up_bias, "experts dgate_up bias", {d.E, d.F});
  if (dbias2) check_f32(*bias_grads.down_bias, "experts ddown bias", {d.E, d.H});
  const int64_t T = d.T, k = d.k, E = d.E, H = d.H, I = d.I, F = d.F, N = T * k;
  check_f32(dout, "experts dout", {T, H});
  const bool wgrad1 = dgate_up.defined(), wgrad2 = ddown.defined();
  if (wgrad1) check_f32(dgate_up, "experts dgate_up", {E, F, H});
  if (wgrad2) check_f32(ddown, "experts ddown", {E, H, I});
  const LoraRef& lora1 = variant.gate_up_lora;
  const LoraRef& lora2 = variant.down_lora;
  const int64_t r1 = lora_rank(lora1, E, H, F, "gate_up"), r2 = lora_rank(lora2, E, I, H, "down");
  check_lora_grads(lora1, lora_grads.gate_up);
  check_lora_grads(lora2, lora_grads.down);
  MT_CHECK(static_cast<int64_t>(s.slot.size()) == N && s.y.defined(), "experts backward without a saved forward");
  const float* g = dout.data_as<float>();
  const float* wp = weights.data_as<float>();
  const float* y = s.y.data_as<float>();
  dweights = Tensor::empty({T, k}, DType::F32);
  float* dwp = dweights.data_as<float>();
  Tensor dy = Tensor::empty({N, H}, DType::F32);
  float* dyp = dy.data_as<float>();
#pragma omp parallel for schedule(static) if ((N * H) >= kParallelMinWork)
  for (int64_t r = 0; r < N; ++r) {
    const int64_t sl = s.slot[r], t = sl / k;
    const float* gr = g + t * H;
    const float* yr = y + r * H;
    double dot = 0.0;
    for (int64_t h = 0; h < H; ++h) {
      dot += static_cast<double>(gr[h]) * yr[h];
      dyp[r * H + h] = gr[h] * wp[sl];
    }
    dwp[sl] = static_cast<float>(dot);
  }

  Tensor dact = Tensor::empty({N, I}, DType::F32);
  Tensor dgu = Tensor::empty({N, F}, DType::F32);
  Tensor dxg = Tensor::empty({N, H}, DType::F32);
  const float* xg = s.xg.data_as<float>();
  const float* gu = s.gate_up.data_as<float>();
  const float* act = s.act.data_as<float>();
  float* dap = dact.data_as<float>();
  float* dgp = dgu.data_as<float>();
  float* dxp = dxg.data_as<float>();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = s.offsets[e], cnt = s.offsets[e + 1] - r0;
    if (cnt == 0) continue;
    Tensor w1 = param_f32(gate_up[e]);
    Tensor w2 = param_f32(down[e]);
    gemm_nn(cnt, I, H, 1.0f, dyp + r0 * H, H, w2.data_as<float>(), I, 0.0f, dap + r0 * I, I);
    if (lora2.on())
      lora_backward_rows(cnt, I, H, r2, act + r0 * I, I, dyp + r0 * H, H, lora2.a->data_as<float>() + e * r2 * I,
                         lora2.b->data_as<float>() + e * H * r2, lora2.scale, dap + r0 * I, I,
                         lora_grads.down.a->data_as<float>() + e * r2 * I,
                         lora_grads.down.b->data_as<float>() + e * H * r2);
    if (wgrad2)
      gemm_tn(H, I, cnt, 1.0f, dyp + r0 * H, H, act + r0 * I, I, 1.0f, ddown.data_as<float>() + e * H * I, I);
    if (dbias2) sum_rows_into(dyp + r0 * H, cnt, H, dbias2 + e * H);
    if (variant.activation == ExpertActivation::swiglu_oai)
      swiglu_oai_backward_rows(cnt, I, dap + r0 * I, I, gu + r0 * F, gu + r0 * F + I, F,
                               dgp + r0 * F, dgp + r0 * F + I, F);
    else if (variant.activation == ExpertActivation::relu2)
      relu2_backward_rows(cnt, I, dap + r0 * I, I, gu + r0 * F, F, dgp + r0 * F, F);
    else
      swiglu_backward_rows(cnt, I, dap + r0 * I, I, gu + r0 * F, gu + r0 * F + I, F, dgp + r0 * F,
                           dgp + r0 * F + I, F);
    if (dbias1) sum_rows_into(dgp + r0 * F, cnt, F, dbias1 + e * F);
    gemm_nn(cnt, H, F, 1.0f, dgp + r0 * F, F, w1.data_as<float>(), H, 0.0f, dxp + r0 * H, H);
    if (lora1.on())
      lora_backward_rows(cnt, H, F, r1, xg + r0 * H, H, dgp + r0 * F, F,
                         lora1.a->data_as<float>() + e * r1 * H, lora1.b->data_as<float>() + e * F * r1,
                         lora1.scale, dxp + r0 * H, H, lora_grads.gate_up.a->data_as<float>() + e * r1 * H,
                         lora_grads.gate_up.b->data_as<float>() + e * F * r1);
    if (wgrad1)
      gemm_tn(F, H, cnt, 1.0f, dgp + r0 * F, F, xg + r0 * H, H, 1.0f,
              dgate_up.data_as<float>() + e * F * H, H);
  }

  dx = Tensor::empty({T, H}, DType::F32);
  float* dxo = dx.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * H * k) >= kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    float* o = dxo + t * H;
    for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float* src = dxp + static_cast<int64_t>(s.row[t * k + j]) * H;
      for (int64_t h = 0; h < H; ++h) o[h] += src[h];
    }
  }
}

}  // namespace mt::cpu
