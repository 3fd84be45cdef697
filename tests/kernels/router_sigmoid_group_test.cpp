// DeepSeek-V3's group-limited sigmoid router (kernels/cpu/router_sigmoid_group.h) against a naive double-precision
// transcription of DeepseekV3TopkRouter.forward (Transformers 5.17, models/deepseek_v3/modeling_deepseek_v3.py; the
// NemotronHTopkRouter code is identical), and its backward against central differences of that reference.
//
// Tolerances. Routing weights: the CPU op rounds in fp32: sigmoid ≤ 2 ulp (expf < 1 ulp, the add and the division
// 0.5 ulp each), the k-term fp32 sum ≤ (k − 1)·0.5 ulp of the sum, then a division and the scale (0.5 ulp each), so
// for k ≤ 8 the relative error is below 8·2^-24 ≈ 5e-7 of the largest weight: limit 2e-6 · max|w|. Selections are
// compared exactly, except where the double reference's scores of the two differing experts lie within 1e-6 (an fp32
// near-tie), which are counted. dlogits: central differences (h = 1e-6) in double are good to ~1e-9; the fp32
// gradient is good to ~1e-6 of its largest element: limit 1e-5 · max|g| + 1e-7 (as the other router tests).
#include "kernels/cpu/router_sigmoid_group.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "op_check.h"

namespace mt {
namespace {

using cpu::SigmoidGroupRouting;

struct NaiveRoute {
  std::vector<int32_t> index;   // [T, k] by descending biased score
  std::vector<double> weights;  // [T, k]
  std::vector<double> choice;   // [T, E] scores_for_choice after the group mask (−inf outside kept groups)
};

// One token of HF's forward in double: sigmoid, + bias, group score = sum of the group's top-2, keep topk_group
// groups (masked_fill −inf), top-k, gather the unbiased sigmoid, / (Σ + 1e-20), × scale. Ties to the lower index.
NaiveRoute naive_forward(const std::vector<double>& logits, const std::vector<double>& bias, int T, int E,
                         const SigmoidGroupRouting& r) {
  const int k = static_cast<int>(r.top_k), G = static_cast<int>(r.groups), per = E / G;
  NaiveRoute out{std::vector<int32_t>(T * k), std::vector<double>(T * k), std::vector<double>(T * E)};
  auto by_value = [](const std::vector<double>& v) {
    std::vector<int> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b]; });
    return order;
  };
  for (int t = 0; t < T; ++t) {
    std::vector<double> s(E), c(E);
    for (int e = 0; e < E; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-logits[t * E + e]));
      c[e] = s[e] + bias[e];
    }
    std::vector<double> gs(G);
    for (int g = 0; g < G; ++g) {
      std::vector<double> grp(c.begin() + g * per, c.begin() + (g + 1) * per);
      std::sort(grp.rbegin(), grp.rend());
      gs[g] = per >= 2 ? grp[0] + grp[1] : grp[0];
    }
    std::vector<int> gorder = by_value(gs);
    std::vector<char> kept(G, 0);
    for (int i = 0; i < r.topk_groups; ++i) kept[gorder[i]] = 1;
    for (int e = 0; e < E; ++e)
      if (!kept[e / per]) c[e] = -INFINITY;
    std::vector<int> order = by_value(c);
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      out.index[t * k + j] = order[j];
      sum += out.weights[t * k + j] = s[order[j]];
    }
    for (int j = 0; j < k; ++j) {
      if (r.norm_topk_prob) out.weights[t * k + j] /= sum + 1e-20;
      out.weights[t * k + j] *= r.scale;
    }
    std::copy(c.begin(), c.end(), out.choice.begin() + t * E);
  }
  return out;
}

// Routing weights for a FIXED selection (the function central differences see in a smooth region).
std::vector<double> naive_weights(const std::vector<double>& logits, const std::vector<int32_t>& idx, int T, int E,
                                  const SigmoidGroupRouting& r) {
  const int k = static_cast<int>(r.top_k);
  std::vector<double> w(T * k);
  for (int t = 0; t < T; ++t) {
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += w[t * k + j] = 1.0 / (1.0 + std::exp(-logits[t * E + idx[t * k + j]]));
    for (int j = 0; j < k; ++j) w[t * k + j] = (r.norm_topk_prob ? w[t * k + j] / (sum + 1e-20) : w[t * k + j]) * r.scale;
  }
  return w;
}

// Correction bias values (std 0: none, zeros).
std::vector<float> bias_values(int E, uint64_t seed, float std) {
  return std > 0 ? test::random_floats(E, seed, std) : std::vector<float>(E, 0.0f);
}

std::vector<int32_t> ints(const Tensor& t) { return {t.data_as<int32_t>(), t.data_as<int32_t>() + t.numel()}; }

// Number of tokens whose selection differs from the naive one; fails on a difference that is not a near-tie.
int compare_selection(const std::vector<int32_t>& got, const NaiveRoute& want, int T, int E, int k) {
  int ties = 0;
  for (int t = 0; t < T; ++t) {
    bool same = true;
    for (int j = 0; j < k; ++j) same &= got[t * k + j] == want.index[t * k + j];
    if (same) continue;
    ++ties;
    for (int j = 0; j < k; ++j) {
      const double a = want.choice[t * E + got[t * k + j]], b = want.choice[t * E + want.index[t * k + j]];
      EXPECT_LE(std::fabs(a - b), 1e-6) << "token " << t << " slot " << j << ": expert " << got[t * k + j] << " vs "
                                        << want.index[t * k + j];
    }
  }
  return ties;
}

struct Case {
  const char* name;
  int T, E;
  SigmoidGroupRouting r;
  float bias_std;
};

const Case kCases[] = {
    {"DeepSeek-V3: E 256, 8 groups keep 4, top-8, x2.5", 64, 256, {8, 8, 4, true, 2.5}, 0.05f},
    {"Moonlight: E 64, 1 group, top-6, x2.446", 64, 64, {6, 1, 1, true, 2.446}, 0.05f},
    {"Nemotron-3-Nano: E 128, 1 group, top-6, x2.5", 32, 128, {6, 1, 1, true, 2.5}, 0.1f},
    {"fixture-like: E 8, 4 groups keep 2, top-2", 40, 8, {2, 4, 2, true, 2.5}, 0.1f},
    {"no renormalisation, x1.5, 1 group, top-3", 40, 8, {3, 1, 1, false, 1.5}, 0.1f},
    {"keep 1 group of 16: top-k from one group only", 40, 64, {4, 4, 1, true, 1.0}, 0.1f},
    {"top-k = every kept expert", 20, 16, {8, 4, 2, true, 1.0}, 0.1f},
    {"groups of 2, no renormalisation", 20, 24, {5, 12, 3, false, 2.0}, 0.1f},
    {"no bias", 30, 32, {4, 4, 2, true, 1.0}, 0.0f},
};

TEST(CpuRouterSigmoidGroup, ForwardMatchesNaiveHf) {
  uint64_t seed = 4000;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const int T = c.T, E = c.E, k = static_cast<int>(c.r.top_k);
    auto lv = test::random_floats(T * E, ++seed, 2.0f);
    auto bv = bias_values(E, ++seed, c.bias_std);
    Tensor bias = c.bias_std > 0 ? test::f32({E}, bv) : Tensor();
    NaiveRoute want = naive_forward(test::to_double(lv), test::to_double(bv), T, E, c.r);
    cpu::RouterOutput got = cpu::router_sigmoid_group_forward(test::f32({T, E}, lv), bias, c.r, false);
    ASSERT_EQ(got.index.shape(), Shape({T, k}));
    ASSERT_EQ(got.weights.shape(), Shape({T, k}));
    const std::vector<int32_t> gi = ints(got.index);
    EXPECT_EQ(compare_selection(gi, want, T, E, k), 0);
    // Every selected expert lies in a kept group: the group mask is respected.
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) EXPECT_TRUE(std::isfinite(want.choice[t * E + gi[t * k + j]])) << "token " << t;
    test::expect_close(got.weights.to_floats(), want.weights, 2e-6, 0.0, "weights");
    // probs = the unbiased sigmoid; value = weights before the scale.
    std::vector<double> sig(T * E);
    for (int i = 0; i < T * E; ++i) sig[i] = 1.0 / (1.0 + std::exp(-static_cast<double>(lv[i])));
    test::expect_close(got.probs.to_floats(), sig, 3e-7, 0.0, "probs");
    const std::vector<float> v = got.value.to_floats(), w = got.weights.to_floats();
    for (int i = 0; i < T * k; ++i) EXPECT_EQ(w[i], v[i] * static_cast<float>(c.r.scale));
    if (c.r.norm_topk_prob)
      for (int t = 0; t < T; ++t) {
        double s = 0;
        for (int j = 0; j < k; ++j) s += v[t * k + j];
        EXPECT_NEAR(s, 1.0, 1e-6) << "token " << t;
      }
  }
}

// HF keeps the router in fp32 in a bf16 model (fp32 linear, fp32 bias buffer, fp32 weights): bf16 mode changes
// nothing, the weights are not rounded. A BF16 bias is read exactly (its values are bf16-representable).
TEST(CpuRouterSigmoidGroup, Bf16ModeKeepsFp32WeightsAndBf16BiasIsExact) {
  const int T = 16, E = 256;
  const SigmoidGroupRouting r{8, 8, 4, true, 2.5};
  auto lv = test::random_floats(T * E, 77, 2.0f);
  auto bv = test::random_floats(E, 78, 0.05f);
  for (auto& x : bv) x = round_bf16(x);
  Tensor logits = test::f32({T, E}, lv), bias = test::f32({E}, bv);
  cpu::RouterOutput a = cpu::router_sigmoid_group_forward(logits, bias, r, false);
  cpu::RouterOutput b = cpu::router_sigmoid_group_forward(logits, bias, r, true);
  cpu::RouterOutput c = cpu::router_sigmoid_group_forward(logits, bias.to(DType::BF16), r, true);
  EXPECT_EQ(ints(a.index), ints(b.index));
  EXPECT_EQ(a.weights.to_floats(), b.weights.to_floats());
  EXPECT_EQ(ints(a.index), ints(c.index));
  EXPECT_EQ(a.weights.to_floats(), c.weights.to_floats());
  int unrounded = 0;
  for (float w : b.weights.to_floats()) unrounded += w != round_bf16(w);
  EXPECT_GT(unrounded, T * 8 / 2) << "bf16 mode must not round the routing weights";
}

// The best single expert sits in a group whose second-best is poor: the group score (top-2 sum) drops the group.
TEST(CpuRouterSigmoidGroup, GroupScoreCanExcludeTheBestExpert) {
  const int E = 8;
  //                 group 0     group 1      group 2    group 3
  std::vector<float> l{6.0f, -6.0f, -1.0f, -1.0f, 2.0f, 2.0f, 0.0f, -3.0f};
  const SigmoidGroupRouting r{2, 4, 1, true, 1.0};
  cpu::RouterOutput o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), Tensor(), r, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({4, 5}));  // group 2 (0.88 + 0.88) beats group 0 (0.998 + 0.002)
  EXPECT_FLOAT_EQ(o.weights.to_floats()[0], 0.5f);
  // Keeping two groups brings expert 0 back, first (it has the highest score); its partner 1 stays out.
  const SigmoidGroupRouting r2{3, 4, 2, true, 1.0};
  o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), Tensor(), r2, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({0, 4, 5}));
  // One group: the plain top-k.
  o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), Tensor(), {2, 1, 1, true, 1.0}, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({0, 4}));
}

// The bias changes the selection (and the group choice), never the weights: they are the unbiased sigmoid.
TEST(CpuRouterSigmoidGroup, BiasSelectsButDoesNotWeigh) {
  const int E = 8;
  std::vector<float> l{3.0f, 2.5f, 0.0f, 0.0f, -1.0f, -1.5f, -2.0f, -2.5f};
  std::vector<float> b{0, 0, 0, 0, 0, 0, 0.9f, 0.95f};
  const SigmoidGroupRouting r{2, 1, 1, true, 2.5};
  cpu::RouterOutput o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), test::f32({E}, b), r, false);
  // c: 0.953 0.924 0.5 0.5 0.269 0.182 1.019 1.026 -> 7, 6
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({7, 6}));
  const double s6 = 1 / (1 + std::exp(2.0)), s7 = 1 / (1 + std::exp(2.5));
  EXPECT_NEAR(o.weights.to_floats()[0], 2.5 * s7 / (s6 + s7), 1e-6);
  EXPECT_NEAR(o.weights.to_floats()[1], 2.5 * s6 / (s6 + s7), 1e-6);
  // With groups of 4: group 1's score (1.026 + 1.019) beats group 0's (0.953 + 0.924) only because of the bias.
  o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), test::f32({E}, b), {3, 2, 1, false, 1.0}, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({7, 6, 4}));
  EXPECT_NEAR(o.weights.to_floats()[2], 1 / (1 + std::exp(1.0)), 1e-7);
  o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), Tensor(), {3, 2, 1, false, 1.0}, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({0, 1, 2}));
}

// Exact ties (documented rule): equal group scores keep the lower groups, equal expert scores the lower experts, and
// slots run by descending biased score; NaN ranks above every number (torch.topk's rule).
TEST(CpuRouterSigmoidGroup, TiesGoToTheLowerIndex) {
  const int E = 8;
  cpu::RouterOutput o =
      cpu::router_sigmoid_group_forward(test::f32({1, E}, std::vector<float>(E, 0.0f)), Tensor(), {3, 4, 2, true, 3.0},
                                        false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({0, 1, 2}));
  for (float w : o.weights.to_floats()) EXPECT_FLOAT_EQ(w, 1.0f);
  // Groups 1, 2 and 3 tie (s(0) + s(1)): the lower two are kept; then experts 3 and 4 tie, and 2 and 5.
  std::vector<float> l{-1, -1, 0, 1, 1, 0, 1, 0};
  o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), Tensor(), {3, 4, 2, true, 1.0}, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({3, 4, 2}));
  // A NaN logit: its group and itself rank first, and its weight (and, normalised, every weight) is NaN.
  l[5] = NAN;
  o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), Tensor(), {2, 4, 1, false, 1.0}, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({5, 4}));
  EXPECT_TRUE(std::isnan(o.weights.to_floats()[0]));
}

// dlogits against central differences of the naive weights with the selection held fixed (the region around random
// logits is smooth: no selection changes within h).
TEST(CpuRouterSigmoidGroup, BackwardMatchesCentralDifferences) {
  uint64_t seed = 5000;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const int T = std::min(c.T, 6), E = c.E, k = static_cast<int>(c.r.top_k);
    auto lv = test::random_floats(T * E, ++seed, 2.0f);
    auto bv = bias_values(E, ++seed, c.bias_std);
    auto dv = test::random_floats(T * k, ++seed);
    cpu::RouterOutput o = cpu::router_sigmoid_group_forward(test::f32({T, E}, lv), test::f32({E}, bv), c.r, false);
    const std::vector<int32_t> idx = ints(o.index);
    Tensor dl = cpu::router_sigmoid_group_backward(test::f32({T, k}, dv), o, c.r);
    ASSERT_EQ(dl.shape(), Shape({T, E}));
    auto g = test::numeric_grad(
        [&](const std::vector<double>& x) { return test::dot(naive_weights(x, idx, T, E, c.r), test::to_double(dv)); },
        test::to_double(lv));
    test::expect_close(dl.to_floats(), g, 1e-5, 1e-7, "dlogits");
    // Zero on every unselected expert.
    const std::vector<float> d = dl.to_floats();
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        if (std::find(idx.begin() + t * k, idx.begin() + (t + 1) * k, e) == idx.begin() + (t + 1) * k) {
          EXPECT_EQ(d[t * E + e], 0.0f) << "token " << t << " expert " << e;
        }
      }
  }
}

// Saturated logits: s = 1 or 0 exactly in fp32 give zero gradient, never NaN; all-zero weights (every s = 0)
// stay finite through the 1e-20 of the normalisation.
TEST(CpuRouterSigmoidGroup, SaturatedLogitsStayFinite) {
  const int E = 4;
  std::vector<float> l{200.0f, -200.0f, -80.0f, -85.0f};  // s = 1, 0, 1.8e-35, 1.2e-37 in fp32
  const SigmoidGroupRouting r{2, 1, 1, true, 2.5};
  cpu::RouterOutput o = cpu::router_sigmoid_group_forward(test::f32({1, E}, l), Tensor(), r, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({0, 2}));
  for (float w : o.weights.to_floats()) EXPECT_TRUE(std::isfinite(w));
  Tensor dl = cpu::router_sigmoid_group_backward(test::f32({1, 2}, {1.0f, -1.0f}), o, r);
  for (float x : dl.to_floats()) EXPECT_TRUE(std::isfinite(x));
  o = cpu::router_sigmoid_group_forward(test::f32({1, E}, std::vector<float>(E, -200.0f)), Tensor(), r, false);
  for (float w : o.weights.to_floats()) EXPECT_EQ(w, 0.0f);
  dl = cpu::router_sigmoid_group_backward(test::f32({1, 2}, {1.0f, -1.0f}), o, r);
  for (float x : dl.to_floats()) EXPECT_TRUE(std::isfinite(x));
}

TEST(CpuRouterSigmoidGroup, ExpertLoadCountsTheSlots) {
  const int T = 50, E = 64;
  const SigmoidGroupRouting r{6, 8, 3, true, 2.5};
  cpu::RouterOutput o =
      cpu::router_sigmoid_group_forward(test::f32({T, E}, test::random_floats(T * E, 9, 2.0f)), Tensor(), r, false);
  Tensor load = cpu::router_expert_load(o.index, E);
  ASSERT_EQ(load.shape(), Shape({E}));
  ASSERT_EQ(load.dtype(), DType::I32);
  std::vector<int32_t> want(E, 0);
  for (int32_t e : ints(o.index)) ++want[e];
  EXPECT_EQ(ints(load), want);
  EXPECT_EQ(std::accumulate(want.begin(), want.end(), 0), T * 6);
  cpu::router_expert_load_add(o.index, load);  // accumulates (several micro-batches of a step)
  for (int& w : want) w *= 2;
  EXPECT_EQ(ints(load), want);
  EXPECT_EQ(ints(cpu::router_expert_load(Tensor::empty({0, 6}, DType::I32), E)), std::vector<int32_t>(E, 0));
  EXPECT_THROW(cpu::router_expert_load(o.index, 10), Error);  // an index outside the experts
  Tensor l64 = Tensor::zeros({E}, DType::I64);
  EXPECT_THROW(cpu::router_expert_load_add(o.index, l64), Error);
}

TEST(CpuRouterSigmoidGroup, ZeroTokensAndOneExpert) {
  const SigmoidGroupRouting r{8, 8, 4, true, 2.5};
  cpu::RouterOutput o = cpu::router_sigmoid_group_forward(Tensor::empty({0, 256}, DType::F32), Tensor(), r, false);
  EXPECT_EQ(o.index.shape(), Shape({0, 8}));
  EXPECT_EQ(cpu::router_sigmoid_group_backward(Tensor::empty({0, 8}, DType::F32), o, r).shape(), Shape({0, 256}));
  o = cpu::router_sigmoid_group_forward(test::f32({2, 1}, {0.3f, -2.0f}), Tensor(), {1, 1, 1, true, 2.5}, false);
  EXPECT_EQ(ints(o.index), std::vector<int32_t>({0, 0}));
  EXPECT_EQ(o.weights.to_floats(), std::vector<float>({2.5f, 2.5f}));
}

TEST(CpuRouterSigmoidGroup, HostileArgumentsThrow) {
  Tensor l = test::f32({2, 256}, test::random_floats(512, 3));
  auto fwd = [&](SigmoidGroupRouting r) { return cpu::router_sigmoid_group_forward(l, Tensor(), r, false); };
  EXPECT_THROW(fwd({8, 3, 1, true, 1.0}), Error);     // n_group does not divide E
  EXPECT_THROW(fwd({8, 0, 1, true, 1.0}), Error);     // n_group 0
  EXPECT_THROW(fwd({8, 8, 9, true, 1.0}), Error);     // topk_group > n_group
  EXPECT_THROW(fwd({8, 8, 0, true, 1.0}), Error);     // topk_group 0
  EXPECT_THROW(fwd({33, 8, 1, true, 1.0}), Error);    // k > the 32 experts of the kept group
  EXPECT_THROW(fwd({257, 1, 1, true, 1.0}), Error);   // k > E
  EXPECT_THROW(fwd({0, 8, 4, true, 1.0}), Error);     // k 0
  EXPECT_THROW(fwd({1, 256, 4, true, 1.0}), Error);   // one expert per group: no top-2
  EXPECT_THROW(fwd({8, 8, 4, true, NAN}), Error);     // scale not finite
  EXPECT_NO_THROW(fwd({8, 256, 256, true, 1.0}));     // nothing masked: one expert per group is fine
  try {
    fwd({8, 3, 1, true, 1.0});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_group 3"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
  const SigmoidGroupRouting r{8, 8, 4, true, 2.5};
  EXPECT_THROW(cpu::router_sigmoid_group_forward(l.to(DType::BF16), Tensor(), r, false), Error);  // logits not F32
  EXPECT_THROW(cpu::router_sigmoid_group_forward(l, test::f32({255}, std::vector<float>(255)), r, false), Error);
  EXPECT_THROW(cpu::router_sigmoid_group_forward(test::f32({512}, test::random_floats(512, 3)), Tensor(), r, false),
               Error);  // 1-D logits
  cpu::RouterOutput o = cpu::router_sigmoid_group_forward(l, Tensor(), r, false);
  EXPECT_THROW(cpu::router_sigmoid_group_backward(test::f32({2, 7}, std::vector<float>(14)), o, r), Error);
  EXPECT_THROW(cpu::router_sigmoid_group_backward(test::f32({2, 8}, std::vector<float>(16)), o, {6, 8, 4, true, 2.5}),
               Error);  // top_k unlike the index
  o.index.data_as<int32_t>()[3] = 256;
  EXPECT_THROW(cpu::router_sigmoid_group_backward(test::f32({2, 8}, std::vector<float>(16)), o, r), Error);
}

}  // namespace
}  // namespace mt
