// GPT-OSS's attention on the CPU (hf-numerics.md §1.6, §4.2): a sliding window of keys and a learned per-head sink
// logit, forward against a naive double loop, backward (q, k, v and the sinks) against its central differences,
// and the eager bf16 rounding rule.
#include <gtest/gtest.h>

#include <cmath>

#include "core/float_convert.h"
#include "kernels/cpu/attention.h"
#include "op_check.h"

namespace mt {
namespace {

using test::expect_close;

struct Geo {
  int B, S, Hq, Hk, D, window;
  double scale;
};

// q [B,S,Hq,D], k/v [B,S,Hk,D], sinks [Hq] (empty: none).
std::vector<double> naive(const Geo& g, const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, const std::vector<double>& sinks) {
  std::vector<double> o(q.size(), 0.0);
  for (int b = 0; b < g.B; ++b)
    for (int h = 0; h < g.Hq; ++h) {
      const int kh = h / (g.Hq / g.Hk);
      for (int i = 0; i < g.S; ++i) {
        std::vector<double> s(g.S, -INFINITY);
        double m = sinks.empty() ? -INFINITY : sinks[h];
        for (int j = 0; j <= i; ++j) {
          if (g.window > 0 && j <= i - g.window) continue;
          double d = 0;
          for (int e = 0; e < g.D; ++e)
            d += q[((b * g.S + i) * g.Hq + h) * g.D + e] * k[((b * g.S + j) * g.Hk + kh) * g.D + e];
          s[j] = d * g.scale;
          m = std::max(m, s[j]);
        }
        double z = sinks.empty() ? 0.0 : std::exp(sinks[h] - m);
        for (int j = 0; j <= i; ++j)
          if (s[j] > -INFINITY) z += std::exp(s[j] - m);
        for (int j = 0; j <= i; ++j) {
          if (s[j] == -INFINITY) continue;
          const double p = std::exp(s[j] - m) / z;
          for (int e = 0; e < g.D; ++e)
            o[((b * g.S + i) * g.Hq + h) * g.D + e] += p * v[((b * g.S + j) * g.Hk + kh) * g.D + e];
        }
      }
    }
  return o;
}

void check(const Geo& g, bool with_sinks) {
  const int nq = g.B * g.S * g.Hq * g.D, nk = g.B * g.S * g.Hk * g.D;
  auto qv = test::random_floats(nq, 61), kv = test::random_floats(nk, 62), vv = test::random_floats(nk, 63),
       dov = test::random_floats(nq, 64), sv = test::random_floats(g.Hq, 65, 1.5f);
  cpu::AttentionShape s{g.B, g.S, g.Hq, g.Hk, g.D};
  s.window = g.window;
  s.scale = static_cast<float>(g.scale);
  const Tensor sinks = with_sinks ? test::f32({g.Hq}, sv) : Tensor();
  const Tensor q = test::f32({g.B, g.S, g.Hq, g.D}, qv), k = test::f32({g.B, g.S, g.Hk, g.D}, kv),
               v = test::f32({g.B, g.S, g.Hk, g.D}, vv);
  Tensor lse;
  const Tensor out = cpu::attention_forward(s, q, k, v, Tensor(), false, lse, sinks);
  const auto Q = test::to_double(qv), K = test::to_double(kv), V = test::to_double(vv), DO = test::to_double(dov);
  const auto SK = with_sinks ? test::to_double(sv) : std::vector<double>();
  expect_close(out.to_floats(), naive(g, Q, K, V, SK), 1e-5, 1e-6, "out");
  Tensor dq, dk, dv, ds = Tensor::zeros({g.Hq}, DType::F32);
  cpu::attention_backward(s, test::f32(q.shape(), dov), q, k, v, Tensor(), lse, false, dq, dk, dv, sinks,
                          with_sinks ? &ds : nullptr);
  auto loss = [&](auto which) {
    return [&, which](const std::vector<double>& x) {
      return test::dot(naive(g, which == 0 ? x : Q, which == 1 ? x : K, which == 2 ? x : V, which == 3 ? x : SK), DO);
    };
  };
  expect_close(dq.to_floats(), test::numeric_grad(loss(0), Q), 1e-4, 1e-6, "dq");
  expect_close(dk.to_floats(), test::numeric_grad(loss(1), K), 1e-4, 1e-6, "dk");
  expect_close(dv.to_floats(), test::numeric_grad(loss(2), V), 1e-4, 1e-6, "dv");
  if (with_sinks) expect_close(ds.to_floats(), test::numeric_grad(loss(3), SK), 1e-4, 1e-6, "dsinks");
}

TEST(CpuAttentionSinksWindow, SinksMatchNaive) { check({2, 5, 4, 2, 4, 0, 0.5}, true); }
TEST(CpuAttentionSinksWindow, WindowMatchesNaive) { check({1, 7, 2, 1, 4, 3, 0.5}, false); }
TEST(CpuAttentionSinksWindow, SinksWindowAndGqa) { check({2, 9, 4, 1, 8, 4, 1.0 / std::sqrt(8.0)}, true); }

// A window as long as the sequence is full causal attention; rows weigh 1 − p_sink in all.
TEST(CpuAttentionSinksWindow, WindowOfTheSequenceIsFullAndSinksTakeTheirShare) {
  const int B = 1, S = 6, H = 2, D = 4;
  auto qv = test::random_floats(B * S * H * D, 66), kv = test::random_floats(B * S * H * D, 67);
  const Tensor q = test::f32({B, S, H, D}, qv), k = test::f32({B, S, H, D}, kv);
  // v = 1 everywhere: each output entry is the row's total weight on the keys.
  const Tensor v = test::f32({B, S, H, D}, std::vector<float>(B * S * H * D, 1.0f));
  cpu::AttentionShape full{B, S, H, H, D}, win = full;
  win.window = S;
  Tensor l1, l2;
  EXPECT_EQ(cpu::attention_forward(full, q, k, v, Tensor(), false, l1).to_floats(),
            cpu::attention_forward(win, q, k, v, Tensor(), false, l2).to_floats());
  const std::vector<float> sv = {0.3f, -1.0f};
  const auto o = cpu::attention_forward(full, q, k, v, Tensor(), false, l1, test::f32({H}, sv)).to_floats();
  const auto lse = l1.to_floats();  // [B, H, S]
  for (int i = 0; i < S; ++i)
    for (int h = 0; h < H; ++h)
      EXPECT_NEAR(o[(i * H + h) * D], 1.0 - std::exp(double(sv[h]) - lse[h * S + i]), 1e-6) << i << " " << h;
}

// Eager bf16 (GPT-OSS in Transformers): the probabilities come from bf16 scores and a bf16 softmax; the output is
// bf16 and close to the fp32 result.
TEST(CpuAttentionSinksWindow, EagerBf16RoundsScoresAndProbabilities) {
  const int B = 1, S = 8, H = 2, D = 8;
  auto qv = test::random_floats(B * S * H * D, 68), kv = test::random_floats(B * S * H * D, 69),
       vv = test::random_floats(B * S * H * D, 70);
  for (auto* x : {&qv, &kv, &vv})
    for (float& f : *x) f = round_bf16(f);
  const Tensor q = test::f32({B, S, H, D}, qv), k = test::f32({B, S, H, D}, kv), v = test::f32({B, S, H, D}, vv),
               sinks = test::f32({H}, {round_bf16(0.5f), round_bf16(-0.25f)});
  cpu::AttentionShape s{B, S, H, H, D};
  s.window = 3;
  Tensor l32, l16e, l16;
  const auto f32 = cpu::attention_forward(s, q, k, v, Tensor(), false, l32, sinks).to_floats();
  const auto sdpa = cpu::attention_forward(s, q, k, v, Tensor(), true, l16, sinks).to_floats();
  s.eager_bf16 = true;
  const auto eager = cpu::attention_forward(s, q, k, v, Tensor(), true, l16e, sinks).to_floats();
  double worst = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_EQ(eager[i], round_bf16(eager[i]));
    worst = std::max(worst, std::fabs(double(eager[i]) - f32[i]));
  }
  // Scores and probabilities are rounded (relative 2^-8 each) before a P·V of |v| ~ 1 over ≤ 3 keys.
  EXPECT_LE(worst, 0.05);
  EXPECT_NE(eager, sdpa);  // the eager rule rounds where sdpa does not
  EXPECT_EQ(l16e.to_floats(), l32.to_floats());  // lse (the backward's) comes from the fp32 scores
}

}  // namespace
}  // namespace mt
