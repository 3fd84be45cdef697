// Router (softmax, top-k, renorm), experts, aux loss and cross-entropy against naive double loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/float_convert.h"
#include "kernels/cpu/aux_loss.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/experts.h"
#include "kernels/cpu/router.h"
#include "op_check.h"

namespace mt {
namespace {

using test::expect_close;

std::vector<double> softmax(const double* z, int n) {
  std::vector<double> p(n);
  double m = *std::max_element(z, z + n), s = 0;
  for (int i = 0; i < n; ++i) s += p[i] = std::exp(z[i] - m);
  for (auto& x : p) x /= s;
  return p;
}

// Routing weights of every token with the given (fixed) selection.
std::vector<double> naive_route(const std::vector<double>& logits, const std::vector<int32_t>& idx, int T, int E,
                                int k, bool renorm) {
  std::vector<double> w(T * k);
  for (int t = 0; t < T; ++t) {
    auto p = softmax(&logits[t * E], E);
    double s = 0;
    for (int j = 0; j < k; ++j) s += w[t * k + j] = p[idx[t * k + j]];
    if (renorm)
      for (int j = 0; j < k; ++j) w[t * k + j] /= s;
  }
  return w;
}

TEST(CpuRouter, TopkSoftmaxRenormAndBackward) {
  const int T = 6, E = 5, k = 2;
  auto lv = test::random_floats(T * E, 31, 2.0f), rv = test::random_floats(T * k, 32);
  for (bool renorm : {false, true}) {
    auto r = cpu::router_forward(test::f32({T, E}, lv), k, renorm, false);
    auto idx = std::vector<int32_t>(r.index.data_as<int32_t>(), r.index.data_as<int32_t>() + T * k);
    for (int t = 0; t < T; ++t) {
      // Naive top-k: sort expert ids by descending logit (softmax is monotone).
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lv[t * E + a] > lv[t * E + b]; });
      for (int j = 0; j < k; ++j) EXPECT_EQ(idx[t * k + j], order[j]);
    }
    auto L = test::to_double(lv);
    expect_close(r.weights.to_floats(), naive_route(L, idx, T, E, k, renorm), 1e-6, 0, "weights");
    if (renorm) {
      auto wts = r.weights.to_floats();
      for (int t = 0; t < T; ++t) EXPECT_NEAR(wts[t * k] + wts[t * k + 1], 1.0, 1e-6);
    }
    auto dl = cpu::router_backward(test::f32({T, k}, rv), r, renorm);
    auto g = test::numeric_grad(
        [&](const std::vector<double>& x) { return test::dot(naive_route(x, idx, T, E, k, renorm), test::to_double(rv)); }, L);
    expect_close(dl.to_floats(), g, 1e-5, 1e-7, renorm ? "dlogits renorm" : "dlogits");
  }
}

TEST(CpuRouter, TiesGoToLowerIndexAndBf16Weights) {
  auto r = cpu::router_forward(test::f32({1, 4}, {0.5f, 1.0f, 0.5f, 1.0f}), 3, false, true);
  const int32_t* idx = r.index.data_as<int32_t>();
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(idx[2], 0);
  for (float w : r.weights.to_floats()) EXPECT_EQ(w, round_bf16(w));
  EXPECT_NE(r.value.to_floats()[0], r.weights.to_floats()[0]);  // the fp32 value is kept unrounded
}

// Naive experts: out[t] = Σ_j w[t,j] · down_e(silu(gate_e x) · up_e x).
std::vector<double> naive_experts(const std::vector<double>& x, const std::vector<int32_t>& idx,
                                  const std::vector<double>& w, const std::vector<double>& gu,
                                  const std::vector<double>& dn, int T, int k, int H, int I) {
  std::vector<double> out(T * H, 0.0);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const int e = idx[t * k + j];
      std::vector<double> a(I);
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int h = 0; h < H; ++h) {
          g += gu[(e * 2 * I + i) * H + h] * x[t * H + h];
          u += gu[(e * 2 * I + I + i) * H + h] * x[t * H + h];
        }
        a[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int h = 0; h < H; ++h) {
        double y = 0;
        for (int i = 0; i < I; ++i) y += dn[(e * H + h) * I + i] * a[i];
        out[t * H + h] += w[t * k + j] * y;
      }
    }
  return out;
}

TEST(CpuExperts, ForwardBackwardWithIdleExperts) {
  const int T = 5, k = 2, E = 4, H = 6, I = 3;
  // Expert 2 receives no token.
  std::vector<int32_t> idx = {0, 1, 3, 0, 1, 3, 0, 3, 1, 0};
  auto xv = test::random_floats(T * H, 33), wv = test::random_floats(T * k, 34),
       guv = test::random_floats(E * 2 * I * H, 35, 0.5f), dnv = test::random_floats(E * H * I, 36, 0.5f),
       rv = test::random_floats(T * H, 37);
  Tensor index = Tensor::empty({T, k}, DType::I32);
  std::copy(idx.begin(), idx.end(), index.data_as<int32_t>());
  Tensor x = test::f32({T, H}, xv), w = test::f32({T, k}, wv), gu = test::f32({E, 2 * I, H}, guv),
         dn = test::f32({E, H, I}, dnv);
  cpu::ExpertsSaved saved;
  auto out = cpu::experts_forward(x, index, w, gu, dn, false, &saved);
  auto X = test::to_double(xv), W = test::to_double(wv), GU = test::to_double(guv), DN = test::to_double(dnv),
       R = test::to_double(rv);
  expect_close(out.to_floats(), naive_experts(X, idx, W, GU, DN, T, k, H, I), 1e-5, 0, "experts out");
  EXPECT_EQ(saved.offsets[3], saved.offsets[2]);  // the idle expert has an empty group

  Tensor dx, dw, dgu = Tensor::zeros({E, 2 * I, H}, DType::F32), ddn = Tensor::zeros({E, H, I}, DType::F32);
  cpu::experts_backward(test::f32({T, H}, rv), w, gu, dn, saved, dx, dw, dgu, ddn);
  expect_close(dx.to_floats(), test::numeric_grad([&](const std::vector<double>& v) { return test::dot(naive_experts(v, idx, W, GU, DN, T, k, H, I), R); }, X), 1e-4, 1e-6, "dx");
  expect_close(dw.to_floats(), test::numeric_grad([&](const std::vector<double>& v) { return test::dot(naive_experts(X, idx, v, GU, DN, T, k, H, I), R); }, W), 1e-4, 1e-6, "dw");
  expect_close(dgu.to_floats(), test::numeric_grad([&](const std::vector<double>& v) { return test::dot(naive_experts(X, idx, W, v, DN, T, k, H, I), R); }, GU), 1e-4, 1e-6, "dgate_up");
  expect_close(ddn.to_floats(), test::numeric_grad([&](const std::vector<double>& v) { return test::dot(naive_experts(X, idx, W, GU, v, T, k, H, I), R); }, DN), 1e-4, 1e-6, "ddown");
  auto dguv = dgu.to_floats();
  for (int i = 2 * 2 * I * H; i < 3 * 2 * I * H; ++i) EXPECT_EQ(dguv[i], 0.0f);  // no gradient for the idle expert
}

TEST(CpuExperts, AllTokensOnOneExpertAndBadIndex) {
  const int T = 3, k = 1, E = 3, H = 4, I = 2;
  Tensor index = Tensor::zeros({T, k}, DType::I32);
  for (int t = 0; t < T; ++t) index.data_as<int32_t>()[t] = 2;
  auto xv = test::random_floats(T * H, 38), guv = test::random_floats(E * 2 * I * H, 39), dnv = test::random_floats(E * H * I, 40);
  std::vector<int32_t> idx(T, 2);
  auto out = cpu::experts_forward(test::f32({T, H}, xv), index, test::f32({T, k}, {1, 1, 1}), test::f32({E, 2 * I, H}, guv),
                                  test::f32({E, H, I}, dnv), false, nullptr);
  expect_close(out.to_floats(), naive_experts(test::to_double(xv), idx, {1, 1, 1}, test::to_double(guv), test::to_double(dnv), T, k, H, I), 1e-5, 0, "out");
  index.data_as<int32_t>()[1] = 3;
  EXPECT_THROW(cpu::experts_forward(test::f32({T, H}, xv), index, test::f32({T, k}, {1, 1, 1}), test::f32({E, 2 * I, H}, guv),
                                    test::f32({E, H, I}, dnv), false, nullptr),
               Error);
}

TEST(CpuExperts, Bf16SumsSlotsInFp32AndRoundsOnce) {
  // One expert that is the identity on a 1-d hidden state is hard to build with SwiGLU; instead
  // check the combine rule directly: y·w per slot rounded, sum in fp32, one final rounding.
  const int T = 1, k = 2, E = 2, H = 2, I = 1;
  std::vector<float> gu = {4, 0, 4, 0, /*e1*/ 4, 0, 4, 0}, dn = {1, 1, 1, 1};
  Tensor index = Tensor::empty({T, k}, DType::I32);
  index.data_as<int32_t>()[0] = 0;
  index.data_as<int32_t>()[1] = 1;
  const float x0 = 1.0f;
  std::vector<float> w = {round_bf16(0.3f), round_bf16(0.7f)};
  auto out = cpu::experts_forward(test::f32({T, H}, {x0, 0.0f}), index, test::f32({T, k}, w), test::f32({E, 2 * I, H}, gu),
                                  test::f32({E, H, I}, dn), true, nullptr)
                 .to_floats();
  // gate = up = 4: a = bf16(bf16(silu(4)) · 4), y = bf16(a)
  const float a = round_bf16(round_bf16(4.0f / (1.0f + std::exp(-4.0f))) * 4.0f);
  const float want = round_bf16(round_bf16(a * w[0]) + round_bf16(a * w[1]));
  // Exact on any BLAS kernel: the GEMMs multiply by 4, 1 and 0 (every product and sum is exact).
  EXPECT_EQ(out[0], want);
  EXPECT_EQ(out[1], want);
}

// Naive aux loss (fp32 mode) with selections recomputed from the logits.
double naive_aux(const std::vector<std::vector<double>>& layers, int T, int E, int k) {
  std::vector<double> cnt(E, 0), ps(E, 0);
  int rows = 0;
  for (auto& l : layers) {
    for (int t = 0; t < T; ++t) {
      auto p = softmax(&l[t * E], E);
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      for (int j = 0; j < k; ++j) cnt[order[j]] += 1;
      for (int e = 0; e < E; ++e) ps[e] += p[e];
    }
    rows += T;
  }
  double a = 0;
  for (int e = 0; e < E; ++e) a += (cnt[e] / rows) * (ps[e] / rows);
  return a * E;
}

TEST(CpuAuxLoss, UniformRoutingGivesK) {
  for (bool bf16 : {false, true}) {
    std::vector<Tensor> l = {Tensor::zeros({3, 8}, DType::F32), Tensor::zeros({3, 8}, DType::F32)};
    EXPECT_NEAR(cpu::aux_loss_forward(l, 2, bf16, nullptr), 2.0, 1e-6);
    EXPECT_NEAR(cpu::aux_loss_forward(l, 3, bf16, nullptr), 3.0, 1e-6);
  }
}

TEST(CpuAuxLoss, ForwardBackwardMatchNaive) {
  const int T = 7, E = 5, k = 2;
  auto a = test::random_floats(T * E, 41, 2.0f), b = test::random_floats(T * E, 42, 2.0f);
  std::vector<Tensor> l = {test::f32({T, E}, a), test::f32({T, E}, b)};
  cpu::AuxLossSaved saved;
  const double aux = cpu::aux_loss_forward(l, k, false, &saved);
  EXPECT_NEAR(aux, naive_aux({test::to_double(a), test::to_double(b)}, T, E, k), 1e-6);
  std::vector<Tensor> d = {Tensor::zeros({T, E}, DType::F32), Tensor::zeros({T, E}, DType::F32)};
  cpu::aux_loss_backward(0.5, l, saved, false, d);
  // f_e is a count: the numeric gradient holds the selection fixed (no near-ties at h = 1e-6).
  auto ga = test::numeric_grad([&](const std::vector<double>& x) { return 0.5 * naive_aux({x, test::to_double(b)}, T, E, k); }, test::to_double(a));
  auto gb = test::numeric_grad([&](const std::vector<double>& x) { return 0.5 * naive_aux({test::to_double(a), x}, T, E, k); }, test::to_double(b));
  expect_close(d[0].to_floats(), ga, 1e-4, 1e-7, "daux layer 0");
  expect_close(d[1].to_floats(), gb, 1e-4, 1e-7, "daux layer 1");
}

TEST(CpuCrossEntropy, ShiftSumCountAndGradient) {
  const int B = 2, S = 4, V = 6;
  Tensor labels = Tensor::empty({B, S}, DType::I64);
  int64_t lv[] = {3, 1, -100, 5, 0, 2, 2, -100};
  std::copy(lv, lv + 8, labels.data_as<int64_t>());
  Tensor tg = cpu::causal_lm_targets(labels, V);
  const int64_t want_t[] = {1, -100, 5, -100, 2, 2, -100, -100};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(tg.data_as<int64_t>()[i], want_t[i]) << i;
  auto zv = test::random_floats(B * S * V, 43, 3.0f);
  Tensor z = test::f32({B * S, V}, zv);
  auto naive = [&](const std::vector<double>& zz) {
    double s = 0;
    for (int t = 0; t < B * S; ++t) {
      if (want_t[t] < 0) continue;
      double m = -INFINITY, e = 0;
      for (int v = 0; v < V; ++v) m = std::max(m, zz[t * V + v]);
      for (int v = 0; v < V; ++v) e += std::exp(zz[t * V + v] - m);
      s += m + std::log(e) - zz[t * V + want_t[t]];
    }
    return s;
  };
  auto r = cpu::cross_entropy_forward(z, tg);
  EXPECT_EQ(r.count, 4);
  EXPECT_NEAR(r.loss_sum, naive(test::to_double(zv)), 1e-5);
  Tensor d = Tensor::empty({B * S, V}, DType::F32);
  cpu::cross_entropy_backward(z, tg, 0.25f, d);
  auto g = test::numeric_grad([&](const std::vector<double>& x) { return 0.25 * naive(x); }, test::to_double(zv));
  expect_close(d.to_floats(), g, 1e-5, 1e-7, "dlogits");
}

TEST(CpuCrossEntropy, AllIgnoredGivesZeroCountNoNan) {
  Tensor labels = Tensor::empty({1, 3}, DType::I64);
  for (int i = 0; i < 3; ++i) labels.data_as<int64_t>()[i] = -100;
  Tensor tg = cpu::causal_lm_targets(labels, 4);
  Tensor z = test::f32({3, 4}, test::random_floats(12, 44));
  auto r = cpu::cross_entropy_forward(z, tg);
  EXPECT_EQ(r.count, 0);
  EXPECT_EQ(r.loss_sum, 0.0);
  Tensor d = Tensor::empty({3, 4}, DType::F32);
  cpu::cross_entropy_backward(z, tg, 1.0f, d);
  for (float v : d.to_floats()) EXPECT_EQ(v, 0.0f);
}

TEST(CpuCrossEntropy, BadLabelsAreRejected) {
  Tensor labels = Tensor::empty({1, 2}, DType::I64);
  labels.data_as<int64_t>()[0] = 0;
  labels.data_as<int64_t>()[1] = 4;
  EXPECT_THROW(cpu::causal_lm_targets(labels, 4), Error);
  labels.data_as<int64_t>()[1] = -5;
  EXPECT_THROW(cpu::causal_lm_targets(labels, 4), Error);
}

}  // namespace
}  // namespace mt
