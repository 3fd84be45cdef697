// GPT-OSS's MoE ops on the CPU (hf-numerics.md §4.2) against naive double references and their central finite
// differences: the top-k-then-softmax router, the clamped SwiGLU, experts with biases, a biased linear.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/float_convert.h"
#include "kernels/cpu/experts.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/router.h"
#include "kernels/cpu/swiglu_oai.h"
#include "op_check.h"

namespace mt {
namespace {

using test::expect_close;

// softmax over the k selected logits, placed at their slots.
std::vector<double> naive_topk_softmax(const std::vector<double>& logits, const std::vector<int32_t>& idx, int T,
                                       int E, int k) {
  std::vector<double> w(T * k);
  for (int t = 0; t < T; ++t) {
    double m = -1e300, sum = 0;
    for (int s = 0; s < k; ++s) m = std::max(m, logits[t * E + idx[t * k + s]]);
    for (int s = 0; s < k; ++s) sum += std::exp(logits[t * E + idx[t * k + s]] - m);
    for (int s = 0; s < k; ++s) w[t * k + s] = std::exp(logits[t * E + idx[t * k + s]] - m) / sum;
  }
  return w;
}

TEST(CpuGptOssRouter, TopkOfLogitsThenSoftmaxAndBackward) {
  const int T = 7, E = 6, k = 3;
  auto lv = test::random_floats(T * E, 41, 2.0f), rv = test::random_floats(T * k, 42);
  auto r = cpu::router_topk_softmax_forward(test::f32({T, E}, lv), k, false);
  const std::vector<int32_t> idx(r.index.data_as<int32_t>(), r.index.data_as<int32_t>() + T * k);
  for (int t = 0; t < T; ++t) {
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lv[t * E + a] > lv[t * E + b]; });
    for (int s = 0; s < k; ++s) EXPECT_EQ(idx[t * k + s], order[s]);
  }
  const auto L = test::to_double(lv);
  const auto want = naive_topk_softmax(L, idx, T, E, k);
  expect_close(r.weights.to_floats(), want, 1e-6, 0, "weights");
  for (int t = 0; t < T; ++t) EXPECT_NEAR(want[t * k] + want[t * k + 1] + want[t * k + 2], 1.0, 1e-12);
  const Tensor dl = cpu::router_topk_softmax_backward(test::f32({T, k}, rv), r);
  const auto g = test::numeric_grad(
      [&](const std::vector<double>& x) { return test::dot(naive_topk_softmax(x, idx, T, E, k), test::to_double(rv)); },
      L);
  expect_close(dl.to_floats(), g, 1e-5, 1e-7, "dlogits");
  // bf16 weights are the rounded softmax; the unrounded values are kept for the backward.
  auto rb = cpu::router_topk_softmax_forward(test::f32({T, E}, lv), k, true);
  for (float w : rb.weights.to_floats()) EXPECT_EQ(w, round_bf16(w));
}

double naive_oai(double g, double u) {
  const double gc = std::min(g, 7.0), uc = std::clamp(u, -7.0, 7.0);
  return (uc + 1.0) * gc / (1.0 + std::exp(-1.702 * gc));
}

TEST(CpuSwigluOai, ClampsAndGradients) {
  // Values on both sides of the clamps, none on a clamp's edge (where the derivative jumps).
  const std::vector<float> g = {-3.0f, -0.5f, 0.0f, 0.7f, 2.5f, 6.9f, 7.5f, 12.0f},
                           u = {-9.0f, -7.5f, -2.0f, 0.0f, 1.5f, 6.5f, 8.0f, 3.0f};
  const int F = static_cast<int>(g.size());
  std::vector<float> a(F), da(F, 0.0f), dg(F), du(F);
  cpu::swiglu_oai_forward_rows(1, F, g.data(), u.data(), F, a.data(), F, false);
  std::vector<double> want(F);
  for (int i = 0; i < F; ++i) want[i] = naive_oai(g[i], u[i]);
  expect_close(a, want, 1e-6, 1e-7, "a");
  EXPECT_FLOAT_EQ(a[7], static_cast<float>(naive_oai(7.0, 3.0)));  // gate clamped to 7: same as g = 7
  EXPECT_FLOAT_EQ(a[1], static_cast<float>(naive_oai(-0.5, -7.0)));  // up clamped to −7
  const auto dav = test::random_floats(F, 43);
  cpu::swiglu_oai_backward_rows(1, F, dav.data(), F, g.data(), u.data(), F, dg.data(), du.data(), F);
  for (int i = 0; i < F; ++i) {
    const double h = 1e-5;
    const double ng = (naive_oai(g[i] + h, u[i]) - naive_oai(g[i] - h, u[i])) / (2 * h);
    const double nu = (naive_oai(g[i], u[i] + h) - naive_oai(g[i], u[i] - h)) / (2 * h);
    EXPECT_NEAR(dg[i], dav[i] * ng, 1e-5 * (1 + std::fabs(dav[i] * ng))) << "dg at " << i;
    EXPECT_NEAR(du[i], dav[i] * nu, 1e-5 * (1 + std::fabs(dav[i] * nu))) << "du at " << i;
  }
  EXPECT_EQ(dg[6], 0.0f);  // g > 7
  EXPECT_EQ(du[0], 0.0f);  // u < −7
  // bf16: every intermediate rounded, so the output is a bf16 value.
  cpu::swiglu_oai_forward_rows(1, F, g.data(), u.data(), F, a.data(), F, true);
  for (float v : a) EXPECT_EQ(v, round_bf16(v));
}

// out[t] = Σ_j w · (down_e(act(gate_e x + bg_e, up_e x + bu_e)) + bd_e), act the clamped SwiGLU.
std::vector<double> naive_oai_experts(const std::vector<double>& x, const std::vector<int32_t>& idx,
                                      const std::vector<double>& w, const std::vector<double>& gu,
                                      const std::vector<double>& gub, const std::vector<double>& dn,
                                      const std::vector<double>& dnb, int T, int k, int H, int I) {
  std::vector<double> out(T * H, 0.0);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const int e = idx[t * k + j];
      std::vector<double> a(I);
      for (int i = 0; i < I; ++i) {
        double g = gub[e * 2 * I + i], u = gub[e * 2 * I + I + i];
        for (int h = 0; h < H; ++h) {
          g += gu[(e * 2 * I + i) * H + h] * x[t * H + h];
          u += gu[(e * 2 * I + I + i) * H + h] * x[t * H + h];
        }
        a[i] = naive_oai(g, u);
      }
      for (int h = 0; h < H; ++h) {
        double y = dnb[e * H + h];
        for (int i = 0; i < I; ++i) y += dn[(e * H + h) * I + i] * a[i];
        out[t * H + h] += w[t * k + j] * y;
      }
    }
  return out;
}

TEST(CpuGptOssExperts, BiasedClampedExpertsForwardBackward) {
  const int T = 5, k = 2, E = 4, H = 6, I = 3;
  std::vector<int32_t> idx = {0, 1, 3, 0, 1, 3, 0, 3, 1, 0};  // expert 2 idle
  // Scale 1.5 so that some pre-activations pass the ±7 clamps.
  auto xv = test::random_floats(T * H, 44, 1.5f), wv = test::random_floats(T * k, 45),
       guv = test::random_floats(E * 2 * I * H, 46, 1.5f), gubv = test::random_floats(E * 2 * I, 47),
       dnv = test::random_floats(E * H * I, 48, 0.5f), dnbv = test::random_floats(E * H, 49),
       rv = test::random_floats(T * H, 50);
  Tensor index = Tensor::empty({T, k}, DType::I32);
  std::copy(idx.begin(), idx.end(), index.data_as<int32_t>());
  Tensor x = test::f32({T, H}, xv), w = test::f32({T, k}, wv), gu = test::f32({E, 2 * I, H}, guv),
         gub = test::f32({E, 2 * I}, gubv), dn = test::f32({E, H, I}, dnv), dnb = test::f32({E, H}, dnbv);
  cpu::ExpertsVariant v;
  v.activation = cpu::ExpertActivation::swiglu_oai;
  v.gate_up_bias = &gub;
  v.down_bias = &dnb;
  cpu::ExpertsSaved saved;
  const Tensor out = cpu::experts_forward(x, index, w, gu, dn, false, &saved, v);
  const auto X = test::to_double(xv), W = test::to_double(wv), GU = test::to_double(guv), GUB = test::to_double(gubv),
             DN = test::to_double(dnv), DNB = test::to_double(dnbv), R = test::to_double(rv);
  expect_close(out.to_floats(), naive_oai_experts(X, idx, W, GU, GUB, DN, DNB, T, k, H, I), 1e-5, 0, "out");
  int clamped = 0;
  for (float p : saved.gate_up.to_floats()) clamped += std::fabs(p) > 7.0f;
  EXPECT_GT(clamped, 0) << "no pre-activation reached a clamp: the test does not cover them";

  Tensor dx, dw, dgu = Tensor::zeros({E, 2 * I, H}, DType::F32), ddn = Tensor::zeros({E, H, I}, DType::F32),
                 dgub = Tensor::zeros({E, 2 * I}, DType::F32), ddnb = Tensor::zeros({E, H}, DType::F32);
  cpu::experts_backward(test::f32({T, H}, rv), w, gu, dn, saved, dx, dw, dgu, ddn, v, {&dgub, &ddnb});
  auto f = [&](auto&& mutate) {
    return [&, mutate](const std::vector<double>& p) {
      auto args = std::make_tuple(X, W, GU, GUB, DN, DNB);
      mutate(args, p);
      return test::dot(naive_oai_experts(std::get<0>(args), idx, std::get<1>(args), std::get<2>(args),
                                         std::get<3>(args), std::get<4>(args), std::get<5>(args), T, k, H, I),
                       R);
    };
  };
  expect_close(dx.to_floats(), test::numeric_grad(f([](auto& a, const auto& p) { std::get<0>(a) = p; }), X), 1e-4, 1e-6, "dx");
  expect_close(dw.to_floats(), test::numeric_grad(f([](auto& a, const auto& p) { std::get<1>(a) = p; }), W), 1e-4, 1e-6, "dw");
  expect_close(dgu.to_floats(), test::numeric_grad(f([](auto& a, const auto& p) { std::get<2>(a) = p; }), GU), 1e-4, 1e-6, "dgate_up");
  expect_close(dgub.to_floats(), test::numeric_grad(f([](auto& a, const auto& p) { std::get<3>(a) = p; }), GUB), 1e-4, 1e-6, "dgate_up_bias");
  expect_close(ddn.to_floats(), test::numeric_grad(f([](auto& a, const auto& p) { std::get<4>(a) = p; }), DN), 1e-4, 1e-6, "ddown");
  expect_close(ddnb.to_floats(), test::numeric_grad(f([](auto& a, const auto& p) { std::get<5>(a) = p; }), DNB), 1e-4, 1e-6, "ddown_bias");
  const auto ddnbv = ddnb.to_floats();
  for (int h = 0; h < H; ++h) EXPECT_EQ(ddnbv[2 * H + h], 0.0f);  // the idle expert's bias gets nothing
}

TEST(CpuLinear, BiasRoundsOnceAndItsGradientSumsRows) {
  const int N = 4, in = 5, out = 3;
  auto xv = test::random_floats(N * in, 51), wv = test::random_floats(out * in, 52), bv = test::random_floats(out, 53);
  const Tensor y = cpu::linear_forward(test::f32({N, in}, xv), test::f32({out, in}, wv), test::f32({out}, bv), false);
  std::vector<double> want(N * out);
  for (int r = 0; r < N; ++r)
    for (int o = 0; o < out; ++o) {
      double s = bv[o];
      for (int i = 0; i < in; ++i) s += double(xv[r * in + i]) * wv[o * in + i];
      want[r * out + o] = s;
    }
  expect_close(y.to_floats(), want, 1e-6, 1e-6, "y");
  const Tensor yb = cpu::linear_forward(test::f32({N, in}, xv), test::f32({out, in}, wv), test::f32({out}, bv), true);
  const auto yf = y.to_floats(), ybf = yb.to_floats();
  for (size_t i = 0; i < yf.size(); ++i) EXPECT_EQ(ybf[i], round_bf16(yf[i]));  // one rounding, after the add
  auto dyv = test::random_floats(N * out, 54);
  Tensor db = Tensor::zeros({out}, DType::F32);
  cpu::bias_backward(test::f32({N, out}, dyv), db);
  for (int o = 0; o < out; ++o) {
    double s = 0;
    for (int r = 0; r < N; ++r) s += dyv[r * out + o];
    EXPECT_NEAR(db.to_floats()[o], s, 1e-6);
  }
}

}  // namespace
}  // namespace mt
