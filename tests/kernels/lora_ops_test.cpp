// LoRA on a linear layer and on grouped experts (kernels/cpu/lora.h, experts.h) against independent references:
// the merged weight W + s·B·A run through the plain ops, double-precision loops, and central differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/float_convert.h"
#include "kernels/cpu/experts.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/lora.h"
#include "op_check.h"

namespace mt {
namespace {

using test::expect_close;

// W + s·B·A in double ([out, in]), rounded to fp32.
std::vector<float> merged(const std::vector<float>& w, const std::vector<float>& a, const std::vector<float>& b,
                          int out, int in, int r, double s) {
  std::vector<float> m(w.size());
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) {
      double d = 0;
      for (int j = 0; j < r; ++j) d += static_cast<double>(b[o * r + j]) * a[j * in + i];
      m[o * in + i] = static_cast<float>(w[o * in + i] + s * d);
    }
  return m;
}

// y = x·Wᵀ + bias + s·(x·Aᵀ)·Bᵀ in double.
std::vector<double> naive_lora(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                               const std::vector<double>& A, const std::vector<double>& B, int n, int in, int out,
                               int r, double s) {
  std::vector<double> y(n * out);
  for (int t = 0; t < n; ++t) {
    std::vector<double> u(r, 0.0);
    for (int j = 0; j < r; ++j)
      for (int i = 0; i < in; ++i) u[j] += x[t * in + i] * A[j * in + i];
    for (int o = 0; o < out; ++o) {
      double v = b.empty() ? 0.0 : b[o];
      for (int i = 0; i < in; ++i) v += x[t * in + i] * w[o * in + i];
      for (int j = 0; j < r; ++j) v += s * u[j] * B[o * r + j];
      y[t * out + o] = v;
    }
  }
  return y;
}

TEST(CpuLora, LinearForwardEqualsMergedWeightAndNaive) {
  const int n = 7, in = 12, out = 10, r = 3;
  const float s = 32.0f / 3;
  auto xv = test::random_floats(n * in, 1), wv = test::random_floats(out * in, 2, 0.3f);
  auto av = test::random_floats(r * in, 3, 0.3f), bv = test::random_floats(out * r, 4, 0.1f);
  auto biasv = test::random_floats(out, 5);
  Tensor A = test::f32({r, in}, av), B = test::f32({out, r}, bv);
  const cpu::LoraRef lora{&A, &B, s};
  Tensor y = cpu::lora_linear_forward(test::f32({n, in}, xv), test::f32({out, in}, wv), test::f32({out}, biasv), lora,
                                      false);
  // fp32 sums of a dozen terms of size ~1..10: 1e-5 relative covers the rounding of both orders.
  expect_close(y.to_floats(),
               naive_lora(test::to_double(xv), test::to_double(wv), test::to_double(biasv), test::to_double(av),
                          test::to_double(bv), n, in, out, r, s),
               1e-5, 0, "lora vs naive");
  Tensor ym = cpu::linear_forward(test::f32({n, in}, xv), test::f32({out, in}, merged(wv, av, bv, out, in, r, s)),
                                  test::f32({out}, biasv), false);
  auto ymf = ym.to_floats();
  expect_close(y.to_floats(), std::vector<double>(ymf.begin(), ymf.end()), 1e-5, 0, "lora vs merged weight");
}

TEST(CpuLora, ZeroBGivesTheBaseExactly) {
  const int n = 5, in = 8, out = 6, r = 4;
  auto xv = test::random_floats(n * in, 11), wv = test::random_floats(out * in, 12);
  Tensor A = test::f32({r, in}, test::random_floats(r * in, 13)), B = Tensor::zeros({out, r}, DType::F32);
  for (bool bf16 : {false, true}) {
    std::vector<float> x = xv;
    if (bf16)
      for (auto& v : x) v = round_bf16(v);
    Tensor w = test::f32({out, in}, wv);
    Tensor base = cpu::linear_forward(test::f32({n, in}, x), w, bf16);
    Tensor y = cpu::lora_linear_forward(test::f32({n, in}, x), w, Tensor(), {&A, &B, 2.0f}, bf16);
    EXPECT_EQ(y.to_floats(), base.to_floats()) << "bf16 " << bf16;
  }
}

// bf16 base: PEFT adds the fp32 adapter output to the bf16-rounded base output and rounds the sum once.
// Base x·w = 1 + 2^-9 rounds to 1 (below half of bf16's ulp 2^-7 at 1). An adapter output δ = 0.75·2^-8 gives
// bf16(1 + δ) = 1; adding it to the unrounded base instead would give 1 + 1.25·2^-8, which rounds up to 1 + 2^-7.
TEST(CpuLora, Bf16RoundsTheBaseThenTheSum) {
  Tensor x = test::f32({1, 2}, {1.0f, 1.0f});
  Tensor w = test::f32({1, 2}, {1.0f, std::ldexp(1.0f, -9)});
  Tensor A = test::f32({1, 2}, {1.0f, 0.0f});
  // s·B = δ with s = 2.
  Tensor B = test::f32({1, 1}, {std::ldexp(1.0f, -9) - std::ldexp(1.0f, -11)});
  EXPECT_EQ(cpu::lora_linear_forward(x, w, Tensor(), {&A, &B, 2.0f}, true).to_floats()[0], 1.0f);
  // δ = 1.25·2^-8 crosses half an ulp on its own: 1 + 2^-7.
  Tensor B2 = test::f32({1, 1}, {std::ldexp(1.0f, -9) + std::ldexp(1.0f, -11)});
  EXPECT_EQ(cpu::lora_linear_forward(x, w, Tensor(), {&A, &B2, 2.0f}, true).to_floats()[0],
            1.0f + std::ldexp(1.0f, -7));
}

// Gradients of L = Σ y ⊙ R: the double-precision analytic values (dx = R·(W + sBA), dA = s·(R·B)ᵀ·x,
// dB = s·Rᵀ·(x·Aᵀ)) and central differences of the fp32 kernel (L is linear in each of x, A, B, so central
// differences are exact but for fp32 rounding of L: |L| ~ 10, h = 1e-2 -> error ~ 1e-4 relative at most).
TEST(CpuLora, LinearBackwardMatchesAnalyticAndFiniteDifferences) {
  const int n = 6, in = 9, out = 7, r = 2;
  const float s = 4.0f;
  auto xv = test::random_floats(n * in, 21), wv = test::random_floats(out * in, 22, 0.3f);
  auto av = test::random_floats(r * in, 23, 0.3f), bv = test::random_floats(out * r, 24, 0.3f);
  auto rv = test::random_floats(n * out, 25);
  Tensor x = test::f32({n, in}, xv), w = test::f32({out, in}, wv), A = test::f32({r, in}, av),
         B = test::f32({out, r}, bv);
  Tensor dx = Tensor::empty({n, in}, DType::F32), dw = Tensor::zeros({out, in}, DType::F32);
  Tensor dA = Tensor::zeros({r, in}, DType::F32), dB = Tensor::zeros({out, r}, DType::F32);
  cpu::lora_linear_backward(test::f32({n, out}, rv), x, w, {&A, &B, s}, &dx, &dw, {&dA, &dB});

  std::vector<double> m(out * in), gdx(n * in, 0), gA(r * in, 0), gB(out * r, 0), gw(out * in, 0);
  auto mf = merged(wv, av, bv, out, in, r, s);
  for (int t = 0; t < n; ++t) {
    std::vector<double> rb(r, 0), u(r, 0);
    for (int j = 0; j < r; ++j) {
      for (int o = 0; o < out; ++o) rb[j] += double(rv[t * out + o]) * bv[o * r + j];
      for (int i = 0; i < in; ++i) u[j] += double(xv[t * in + i]) * av[j * in + i];
    }
    for (int i = 0; i < in; ++i) {
      for (int o = 0; o < out; ++o) gdx[t * in + i] += double(rv[t * out + o]) * mf[o * in + i];
      for (int j = 0; j < r; ++j) gA[j * in + i] += s * rb[j] * xv[t * in + i];
      for (int o = 0; o < out; ++o) gw[o * in + i] += double(rv[t * out + o]) * xv[t * in + i];
    }
    for (int o = 0; o < out; ++o)
      for (int j = 0; j < r; ++j) gB[o * r + j] += s * rv[t * out + o] * u[j];
  }
  expect_close(dx.to_floats(), gdx, 1e-5, 0, "dx");
  expect_close(dA.to_floats(), gA, 1e-5, 0, "dA");
  expect_close(dB.to_floats(), gB, 1e-5, 0, "dB");
  expect_close(dw.to_floats(), gw, 1e-5, 0, "dW (base)");

  auto loss = [&](const Tensor& xx, const Tensor& aa, const Tensor& bb) {
    auto y = cpu::lora_linear_forward(xx, w, Tensor(), {&aa, &bb, s}, false).to_floats();
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += double(y[i]) * rv[i];
    return l;
  };
  const double h = 1e-2;
  auto fd = [&](std::vector<float> v, size_t i, const std::function<double(const std::vector<float>&)>& f) {
    const float v0 = v[i];
    v[i] = v0 + float(h);
    const double p = f(v);
    v[i] = v0 - float(h);
    return (p - f(v)) / (2 * h);
  };
  const Shape sa{r, in}, sb{out, r}, sx{n, in};
  for (size_t i = 0; i < av.size(); i += 3)
    EXPECT_NEAR(fd(av, i, [&](const std::vector<float>& v) { return loss(x, test::f32(sa, v), B); }),
                dA.to_floats()[i], 2e-3)
        << "dA " << i;
  for (size_t i = 0; i < bv.size(); i += 2)
    EXPECT_NEAR(fd(bv, i, [&](const std::vector<float>& v) { return loss(x, A, test::f32(sb, v)); }),
                dB.to_floats()[i], 2e-3)
        << "dB " << i;
  for (size_t i = 0; i < xv.size(); i += 5)
    EXPECT_NEAR(fd(xv, i, [&](const std::vector<float>& v) { return loss(test::f32(sx, v), A, B); }),
                dx.to_floats()[i], 2e-3)
        << "dx " << i;
}

TEST(CpuLora, FrozenBaseWeightGetsNoGradientAndAdapterGradientsAccumulate) {
  const int n = 4, in = 5, out = 3, r = 2;
  Tensor x = test::f32({n, in}, test::random_floats(n * in, 31)), w = test::f32({out, in}, test::random_floats(out * in, 32));
  Tensor A = test::f32({r, in}, test::random_floats(r * in, 33)), B = test::f32({out, r}, test::random_floats(out * r, 34));
  Tensor dy = test::f32({n, out}, test::random_floats(n * out, 35));
  Tensor dA = Tensor::zeros({r, in}, DType::F32), dB = Tensor::zeros({out, r}, DType::F32);
  cpu::lora_linear_backward(dy, x, w, {&A, &B, 1.5f}, nullptr, nullptr, {&dA, &dB});
  const auto a1 = dA.to_floats(), b1 = dB.to_floats();
  cpu::lora_linear_backward(dy, x, w, {&A, &B, 1.5f}, nullptr, nullptr, {&dA, &dB});
  const auto a2 = dA.to_floats(), b2 = dB.to_floats();
  for (size_t i = 0; i < a1.size(); ++i) EXPECT_EQ(a2[i], 2 * a1[i]);
  for (size_t i = 0; i < b1.size(); ++i) EXPECT_EQ(b2[i], 2 * b1[i]);
  bool nonzero = false;
  for (float v : a1) nonzero = nonzero || v != 0;
  EXPECT_TRUE(nonzero);
}

// Grouped experts: per-expert adapters on both stacks equal the plain experts run over merged stacks
// W_e + s·B_e·A_e, forward and backward (dA_e = s·B_eᵀ·dW_e, dB_e = s·dW_e·A_eᵀ from the merged run's dW_e),
// with an idle expert, for Qwen3-MoE's SwiGLU and GPT-OSS's clamped SwiGLU with biases.
struct ExpertLoraCase {
  bool oai;
};
class CpuLoraExperts : public ::testing::TestWithParam<ExpertLoraCase> {};

TEST_P(CpuLoraExperts, GroupedEqualsMergedStacksForwardBackward) {
  const bool oai = GetParam().oai;
  const int T = 6, k = 2, E = 4, H = 8, I = 5, r = 3;
  const float s = 0.75f;
  auto xv = test::random_floats(T * H, 41);
  // Expert 2 gets no token.
  std::vector<int32_t> idx = {0, 1, 1, 3, 0, 3, 3, 1, 0, 1, 1, 0};
  auto wts = test::random_floats(T * k, 42, 0.5f);
  auto guv = test::random_floats(E * 2 * I * H, 43, 0.3f), dnv = test::random_floats(E * H * I, 44, 0.3f);
  auto a1 = test::random_floats(E * r * H, 45, 0.3f), b1 = test::random_floats(E * 2 * I * r, 46, 0.3f);
  auto a2 = test::random_floats(E * r * I, 47, 0.3f), b2 = test::random_floats(E * H * r, 48, 0.3f);
  auto bias1 = test::random_floats(E * 2 * I, 49, 0.2f), bias2 = test::random_floats(E * H, 50, 0.2f);
  std::vector<float> mgu(guv.size()), mdn(dnv.size());
  for (int e = 0; e < E; ++e) {
    auto sl = [](const std::vector<float>& v, size_t at, size_t n) {
      return std::vector<float>(v.begin() + at, v.begin() + at + n);
    };
    auto m1 = merged(sl(guv, e * 2 * I * H, 2 * I * H), sl(a1, e * r * H, r * H), sl(b1, e * 2 * I * r, 2 * I * r),
                     2 * I, H, r, s);
    auto m2 = merged(sl(dnv, e * H * I, H * I), sl(a2, e * r * I, r * I), sl(b2, e * H * r, H * r), H, I, r, s);
    std::copy(m1.begin(), m1.end(), mgu.begin() + e * 2 * I * H);
    std::copy(m2.begin(), m2.end(), mdn.begin() + e * H * I);
  }
  Tensor x = test::f32({T, H}, xv), index = Tensor::empty({T, k}, DType::I32), weights = test::f32({T, k}, wts);
  std::copy(idx.begin(), idx.end(), index.data_as<int32_t>());
  Tensor gu = test::f32({E, 2 * I, H}, guv), dn = test::f32({E, H, I}, dnv);
  Tensor mg = test::f32({E, 2 * I, H}, mgu), md = test::f32({E, H, I}, mdn);
  Tensor A1 = test::f32({E, r, H}, a1), B1 = test::f32({E, 2 * I, r}, b1), A2 = test::f32({E, r, I}, a2),
         B2 = test::f32({E, H, r}, b2);
  Tensor bs1 = test::f32({E, 2 * I}, bias1), bs2 = test::f32({E, H}, bias2);
  cpu::ExpertsVariant plain;
  if (oai) {
    plain.activation = cpu::ExpertActivation::swiglu_oai;
    plain.gate_up_bias = &bs1;
    plain.down_bias = &bs2;
  }
  cpu::ExpertsVariant adapted = plain;
  adapted.gate_up_lora = {&A1, &B1, s};
  adapted.down_lora = {&A2, &B2, s};

  cpu::ExpertsSaved sv_l, sv_m;
  Tensor yl = cpu::experts_forward(x, index, weights, gu, dn, false, &sv_l, adapted);
  Tensor ym = cpu::experts_forward(x, index, weights, mg, md, false, &sv_m, plain);
  auto ymf = ym.to_floats();
  expect_close(yl.to_floats(), {ymf.begin(), ymf.end()}, 1e-5, 0, "forward");

  Tensor dout = test::f32({T, H}, test::random_floats(T * H, 51));
  Tensor dxl, dwl, dxm, dwm;
  Tensor dgm = Tensor::zeros({E, 2 * I, H}, DType::F32), ddm = Tensor::zeros({E, H, I}, DType::F32);
  Tensor db1 = Tensor::zeros({E, 2 * I}, DType::F32), db2 = Tensor::zeros({E, H}, DType::F32);
  cpu::experts_backward(dout, weights, mg, md, sv_m, dxm, dwm, dgm, ddm, plain,
                        oai ? cpu::ExpertsBiasGrads{&db1, &db2} : cpu::ExpertsBiasGrads{});
  // The adapted run with a frozen base: undefined stack gradients, null bias gradients.
  Tensor none_gu, none_dn;
  Tensor dA1 = Tensor::zeros(A1.shape(), DType::F32), dB1 = Tensor::zeros(B1.shape(), DType::F32);
  Tensor dA2 = Tensor::zeros(A2.shape(), DType::F32), dB2 = Tensor::zeros(B2.shape(), DType::F32);
  cpu::experts_backward(dout, weights, gu, dn, sv_l, dxl, dwl, none_gu, none_dn, adapted, {},
                        {{&dA1, &dB1}, {&dA2, &dB2}});
  auto dxmf = dxm.to_floats(), dwmf = dwm.to_floats();
  expect_close(dxl.to_floats(), {dxmf.begin(), dxmf.end()}, 1e-5, 0, "dx");
  expect_close(dwl.to_floats(), {dwmf.begin(), dwmf.end()}, 1e-5, 0, "d routing weights");

  // dA_e = s·B_eᵀ·dW_e, dB_e = s·dW_e·A_eᵀ, in double from the merged run's dW.
  auto chain = [&](const Tensor& dW, const std::vector<float>& a, const std::vector<float>& b, int out, int in,
                   std::vector<double>& gA, std::vector<double>& gB) {
    auto g = dW.to_floats();
    gA.assign(E * r * in, 0.0);
    gB.assign(E * out * r, 0.0);
    for (int e = 0; e < E; ++e)
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) {
          const double gw = g[(e * out + o) * in + i];
          for (int j = 0; j < r; ++j) {
            gA[(e * r + j) * in + i] += s * b[(e * out + o) * r + j] * gw;
            gB[(e * out + o) * r + j] += s * gw * a[(e * r + j) * in + i];
          }
        }
  };
  std::vector<double> gA1, gB1, gA2, gB2;
  chain(dgm, a1, b1, 2 * I, H, gA1, gB1);
  chain(ddm, a2, b2, H, I, gA2, gB2);
  expect_close(dA1.to_floats(), gA1, 1e-5, 1e-7, "gate_up dA");
  expect_close(dB1.to_floats(), gB1, 1e-5, 1e-7, "gate_up dB");
  expect_close(dA2.to_floats(), gA2, 1e-5, 1e-7, "down dA");
  expect_close(dB2.to_floats(), gB2, 1e-5, 1e-7, "down dB");
  // The idle expert's adapters get exactly zero.
  for (int i = 0; i < r * H; ++i) EXPECT_EQ(dA1.to_floats()[2 * r * H + i], 0.0f);
  for (int i = 0; i < H * r; ++i) EXPECT_EQ(dB2.to_floats()[2 * H * r + i], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Variants, CpuLoraExperts, ::testing::Values(ExpertLoraCase{false}, ExpertLoraCase{true}),
                         [](const auto& info) { return info.param.oai ? "GptOssClampedBiased" : "Qwen3Swiglu"; });

}  // namespace
}  // namespace mt
