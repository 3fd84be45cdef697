// Causal GQA attention with packed documents: forward against a naive double loop, backward against
// its central differences, packed documents against separate runs.
#include <gtest/gtest.h>

#include <cmath>

#include "core/float_convert.h"
#include "kernels/cpu/attention.h"
#include "op_check.h"

namespace mt {
namespace {

using test::expect_close;

struct Geo {
  int B, S, Hq, Hk, D;
  int Dv = 0;  // value head size; 0: D
  int dv() const { return Dv > 0 ? Dv : D; }
};

// q [B,S,Hq,D], k [B,S,Hk,D], v [B,S,Hk,Dv], doc [B*S] or empty; out [B,S,Hq,Dv].
std::vector<double> naive_attention(const Geo& g, const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, const std::vector<int>& doc) {
  const int Dv = g.dv();
  std::vector<double> o(static_cast<size_t>(g.B) * g.S * g.Hq * Dv, 0.0);
  const double scale = 1.0 / std::sqrt((double)g.D);
  for (int b = 0; b < g.B; ++b)
    for (int h = 0; h < g.Hq; ++h) {
      const int kh = h / (g.Hq / g.Hk);
      for (int i = 0; i < g.S; ++i) {
        std::vector<double> s(g.S, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          if (!doc.empty() && doc[b * g.S + j] != doc[b * g.S + i]) continue;
          double d = 0;
          for (int e = 0; e < g.D; ++e)
            d += q[((b * g.S + i) * g.Hq + h) * g.D + e] * k[((b * g.S + j) * g.Hk + kh) * g.D + e];
          s[j] = d * scale;
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j)
          if (s[j] > -INFINITY) z += std::exp(s[j] - m);
        for (int j = 0; j <= i; ++j) {
          if (s[j] == -INFINITY) continue;
          const double p = std::exp(s[j] - m) / z;
          for (int e = 0; e < Dv; ++e)
            o[((b * g.S + i) * g.Hq + h) * Dv + e] += p * v[((b * g.S + j) * g.Hk + kh) * Dv + e];
        }
      }
    }
  return o;
}

Tensor doc_tensor(int B, int S, const std::vector<int>& d) {
  Tensor t = Tensor::empty({B, S}, DType::I32);
  for (int i = 0; i < B * S; ++i) t.data_as<int32_t>()[i] = d[i];
  return t;
}

void check_attention(const Geo& g, const std::vector<int>& doc) {
  const int nq = g.B * g.S * g.Hq * g.D, nk = g.B * g.S * g.Hk * g.D, nv = g.B * g.S * g.Hk * g.dv(),
            no = g.B * g.S * g.Hq * g.dv();
  auto qv = test::random_floats(nq, 21), kv = test::random_floats(nk, 22), vv = test::random_floats(nv, 23),
       rv = test::random_floats(no, 24);
  cpu::AttentionShape s{g.B, g.S, g.Hq, g.Hk, g.D};
  s.v_dim = g.Dv;
  Tensor q = test::f32({g.B, g.S, g.Hq, g.D}, qv), k = test::f32({g.B, g.S, g.Hk, g.D}, kv),
         v = test::f32({g.B, g.S, g.Hk, g.dv()}, vv);
  Tensor doct = doc.empty() ? Tensor() : doc_tensor(g.B, g.S, doc);
  Tensor lse;
  Tensor o = cpu::attention_forward(s, q, k, v, doct, false, lse);
  auto Q = test::to_double(qv), K = test::to_double(kv), Vd = test::to_double(vv), R = test::to_double(rv);
  expect_close(o.to_floats(), naive_attention(g, Q, K, Vd, doc), 1e-5, 0, "attention out");
  Tensor dq, dk, dv;
  cpu::attention_backward(s, test::f32({g.B, g.S, g.Hq, g.dv()}, rv), q, k, v, doct, lse, false, dq, dk, dv);
  expect_close(dq.to_floats(), test::numeric_grad([&](const std::vector<double>& x) { return test::dot(naive_attention(g, x, K, Vd, doc), R); }, Q),
               1e-4, 1e-6, "dq");
  expect_close(dk.to_floats(), test::numeric_grad([&](const std::vector<double>& x) { return test::dot(naive_attention(g, Q, x, Vd, doc), R); }, K),
               1e-4, 1e-6, "dk");
  expect_close(dv.to_floats(), test::numeric_grad([&](const std::vector<double>& x) { return test::dot(naive_attention(g, Q, K, x, doc), R); }, Vd),
               1e-4, 1e-6, "dv");
}

TEST(CpuAttention, CausalGqaMatchesNaive) { check_attention({2, 5, 4, 2, 4}, {}); }
TEST(CpuAttention, MhaAndMqa) {
  check_attention({1, 4, 2, 2, 6}, {});
  check_attention({1, 4, 3, 1, 2}, {});
}
// MLA's shape (DeepSeek-V3): values narrower and wider than the query/key head.
TEST(CpuAttention, ValueHeadSizeUnlikeTheKeys) {
  check_attention({2, 5, 4, 4, 6, 4}, {});
  check_attention({1, 6, 4, 2, 4, 6}, {0, 0, 1, 1, 1, 2});
}
TEST(CpuAttention, PackedDocumentsMatchNaive) { check_attention({2, 6, 4, 2, 4}, {0, 0, 0, 1, 1, 2, 0, 1, 1, 1, 1, 1}); }

TEST(CpuAttention, TwoPackedDocumentsEqualSeparateRuns) {
  const int S1 = 3, S2 = 4, S = S1 + S2, Hq = 2, Hk = 1, D = 4;
  auto qv = test::random_floats(S * Hq * D, 25), kv = test::random_floats(S * Hk * D, 26),
       vv = test::random_floats(S * Hk * D, 27);
  std::vector<int> doc = {0, 0, 0, 1, 1, 1, 1};
  Tensor lse;
  auto packed = cpu::attention_forward({1, S, Hq, Hk, D}, test::f32({1, S, Hq, D}, qv), test::f32({1, S, Hk, D}, kv),
                                       test::f32({1, S, Hk, D}, vv), doc_tensor(1, S, doc), false, lse)
                    .to_floats();
  auto part = [&](int off, int len) {
    auto sub = [&](const std::vector<float>& x, int h) {
      return std::vector<float>(x.begin() + off * h * D, x.begin() + (off + len) * h * D);
    };
    Tensor l;
    return cpu::attention_forward({1, len, Hq, Hk, D}, test::f32({1, len, Hq, D}, sub(qv, Hq)),
                                  test::f32({1, len, Hk, D}, sub(kv, Hk)), test::f32({1, len, Hk, D}, sub(vv, Hk)),
                                  Tensor(), false, l)
        .to_floats();
  };
  auto a = part(0, S1), b = part(S1, S2);
  a.insert(a.end(), b.begin(), b.end());
  ASSERT_EQ(a.size(), packed.size());
  // Not bitwise: 7-row GEMMs against 3- and 4-row ones, for which the CPU BLAS may take other kernels. Each dot
  // product (K ≤ 7) moves by at most K·u·Σ|a·b|; |out| ≤ 1.6 here, and we measured ≤ 1.2e-7 (one ulp) over
  // OpenBLAS's core types. We allow 1e-6.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(packed[i], a[i], 1e-6) << i;
}

TEST(CpuAttention, Bf16OutputIsRoundedAndClose) {
  const Geo g{1, 6, 2, 1, 8};
  auto qv = test::random_floats(g.S * g.Hq * g.D, 28), kv = test::random_floats(g.S * g.Hk * g.D, 29),
       vv = test::random_floats(g.S * g.Hk * g.D, 30);
  for (auto* x : {&qv, &kv, &vv})
    for (auto& f : *x) f = round_bf16(f);
  Tensor lse;
  auto o = cpu::attention_forward({g.B, g.S, g.Hq, g.Hk, g.D}, test::f32({1, g.S, g.Hq, g.D}, qv),
                                  test::f32({1, g.S, g.Hk, g.D}, kv), test::f32({1, g.S, g.Hk, g.D}, vv), Tensor(),
                                  true, lse)
               .to_floats();
  auto want = naive_attention(g, test::to_double(qv), test::to_double(kv), test::to_double(vv), {});
  for (size_t i = 0; i < o.size(); ++i) {
    EXPECT_EQ(o[i], round_bf16(o[i]));
    EXPECT_NEAR(o[i], want[i], 2e-2 * std::fabs(want[i]) + 1e-2);
  }
  // The first query sees only itself: out = v exactly.
  for (int e = 0; e < g.D; ++e) EXPECT_EQ(o[e], vv[e]);
}

}  // namespace
}  // namespace mt
