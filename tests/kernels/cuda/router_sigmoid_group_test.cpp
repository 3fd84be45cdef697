// CUDA group-limited sigmoid router (DeepSeek-V3, Nemotron-H; kernels/cuda/router_sigmoid_group.h) against the CPU
// reference op (kernels/cpu/router_sigmoid_group.h, itself tested against a double transcription of HF's router).
//
// Thresholds. Both sides evaluate the same fp32 expressions in the same order (sigmoid 1/(1 + exp(−x)), c = s + bias,
// top-2 sums, Σ in slot order, one division, the scale); only exp differs (CUDA expf ≤ 2 ulp, glibc < 1 ulp), so s
// differs by ≤ ~3 ulp and a weight by ≤ ~(3 + k) ulp of the largest: max-norm limit 2e-6, rel-L2 1e-6. Ids are
// compared exactly except at near-ties (CPU biased scores within 1e-6 relative, or a group change whose group scores
// are within 1e-6), counted and allowed on at most 1% of tokens; the weights are then compared on tokens whose ids
// agree. dlogits (the CPU's ids on both sides): the same ~ulp-level differences through a few more operations:
// F32 limit 1e-5 / 1e-6; BF16 output is one rounding (2^-8 relative): 6e-3 / 3e-3 (as router_test.cpp).
#include "kernels/cpu/router_sigmoid_group.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/router_sigmoid_group.h"

namespace mt {
namespace {

using cpu::SigmoidGroupRouting;

cudaStream_t stream0() { return cuda::device_context(0).stream; }

std::vector<int32_t> host_ints(const Tensor& dev) {
  Tensor h = cuda::to_host(dev);
  return {h.data_as<int32_t>(), h.data_as<int32_t>() + h.numel()};
}

std::vector<int32_t> ints(const Tensor& host) { return {host.data_as<int32_t>(), host.data_as<int32_t>() + host.numel()}; }

struct Case {
  const char* name;
  int T, E;
  SigmoidGroupRouting r;
  bool bf16_logits;
  bool bias;
};

const Case kCases[] = {
    {"DeepSeek-V3 E 256, 8 groups keep 4, top-8", 1031, 256, {8, 8, 4, true, 2.5}, false, true},
    {"DeepSeek-V3, bf16 logits", 517, 256, {8, 8, 4, true, 2.5}, true, true},
    {"Moonlight E 64, 1 group, top-6", 777, 64, {6, 1, 1, true, 2.446}, false, true},
    {"Nemotron-3-Nano E 128, top-6", 300, 128, {6, 1, 1, true, 2.5}, false, true},
    {"E 8, 4 groups keep 2, top-2", 100, 8, {2, 4, 2, true, 2.5}, false, true},
    {"no renormalisation, no bias", 100, 96, {3, 6, 2, false, 1.5}, false, false},
    {"groups of 2 (lanes cover 6 groups)", 60, 384, {12, 192, 7, true, 1.0}, false, true},
    {"the limits: E 1024, 64 groups keep 3, top-32", 40, 1024, {32, 64, 3, true, 2.0}, false, true},
    {"E 1000 (not a power of 2), 8 groups of 125", 40, 1000, {16, 8, 5, true, 1.0}, true, true},
    {"E 1024 in 512 groups of 2 (> 48 KiB of shared memory)", 40, 1024, {32, 512, 16, true, 1.0}, false, true},
    {"one expert", 5, 1, {1, 1, 1, true, 2.5}, false, true},
};

struct Inputs {
  Tensor host_logits, dev_logits, host_bias, dev_bias;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.host_logits = test::host_random({c.T, c.E}, seed, 2.0f, c.bf16_logits);
  in.dev_logits = test::device_from_host(in.host_logits, c.bf16_logits ? DType::BF16 : DType::F32);
  if (c.bias) {
    in.host_bias = test::host_random({c.E}, seed + 1, 0.05f);
    in.dev_bias = test::device_from_host(in.host_bias, DType::F32);
  }
  return in;
}

// The CPU's biased scores c = s + bias and group scores of one token (for the near-tie allowance).
struct Scores {
  std::vector<float> c, g;
};
Scores scores_of(const Case& c, const Inputs& in, const cpu::RouterOutput& ref, int t) {
  const int E = c.E, G = static_cast<int>(c.r.groups), per = E / G;
  Scores s{std::vector<float>(E), std::vector<float>(G)};
  const float* p = ref.probs.data_as<float>() + static_cast<int64_t>(t) * E;
  for (int e = 0; e < E; ++e) s.c[e] = p[e] + (c.bias ? in.host_bias.data_as<float>()[e] : 0.0f);
  for (int g = 0; g < G; ++g) {
    std::vector<float> grp(s.c.begin() + g * per, s.c.begin() + (g + 1) * per);
    std::sort(grp.rbegin(), grp.rend());
    s.g[g] = per >= 2 ? grp[0] + grp[1] : grp[0];
  }
  return s;
}

// True when the two selections differ only through fp32 near-ties of the CPU's scores.
bool near_tie(const Case& c, const Scores& s, const int32_t* got, const int32_t* want) {
  const int k = static_cast<int>(c.r.top_k), per = c.E / static_cast<int>(c.r.groups);
  for (int j = 0; j < k; ++j) {
    if (got[j] == want[j]) continue;
    const float a = s.c[got[j]], b = s.c[want[j]];
    const float ga = s.g[got[j] / per], gb = s.g[want[j] / per];
    const bool expert_tie = std::fabs(a - b) <= 1e-6f * std::fabs(b);
    const bool group_tie = got[j] / per != want[j] / per && std::fabs(ga - gb) <= 1e-6f * std::fabs(gb);
    if (!expert_tie && !group_tie) return false;
  }
  return true;
}

TEST(CudaRouterSigmoidGroup, ForwardMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 3100;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const int T = c.T, k = static_cast<int>(c.r.top_k);
    Inputs in = make_inputs(c, seed += 2);
    cpu::RouterOutput want = cpu::router_sigmoid_group_forward(in.host_logits, in.host_bias, c.r, c.bf16_logits);
    cuda::RouterResult got = cuda::router_sigmoid_group_forward(in.dev_logits, in.dev_bias, c.r, nullptr, stream0());
    ASSERT_EQ(got.index.shape(), Shape({T, k}));
    ASSERT_EQ(got.weights.dtype(), DType::F32);
    const std::vector<int32_t> gi = host_ints(got.index), wi = ints(want.index);
    const std::vector<float> gw = test::device_floats(got.weights), ww = want.weights.to_floats();
    std::vector<float> gw_same, ww_same;
    int ties = 0;
    for (int t = 0; t < T; ++t) {
      if (std::equal(gi.begin() + t * k, gi.begin() + (t + 1) * k, wi.begin() + t * k)) {
        gw_same.insert(gw_same.end(), gw.begin() + t * k, gw.begin() + (t + 1) * k);
        ww_same.insert(ww_same.end(), ww.begin() + t * k, ww.begin() + (t + 1) * k);
        continue;
      }
      ++ties;
      EXPECT_TRUE(near_tie(c, scores_of(c, in, want, t), &gi[t * k], &wi[t * k])) << "token " << t << ": ids differ";
    }
    EXPECT_LE(ties, T / 100 + 1);
    test::expect_norm(gw_same, ww_same, 2e-6, 1e-6, "routing weights");
  }
}

// Exact ties and NaN: the same rule on both sides (lower index first; NaN ranks first).
TEST(CudaRouterSigmoidGroup, TiesAndNanAsTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const int E = 64;
  std::vector<float> v(5 * E, -1.0f);
  for (int e = 0; e < E; ++e) v[e] = 0.0f;                                  // every score equal
  for (int g : {1, 3, 6}) v[E + 8 * g] = 2.0f, v[E + 8 * g + 1] = 1.0f;      // three groups tie; two are kept
  v[2 * E + 17] = 3.0f, v[2 * E + 40] = 3.0f, v[2 * E + 41] = 3.0f;          // expert ties across lanes
  v[2 * E + 16] = 3.0f;
  v[3 * E + 50] = NAN;                                                      // a NaN logit
  v[4 * E + 63] = 5.0f, v[4 * E + 31] = 5.0f;                               // ties in the last lane
  const SigmoidGroupRouting r{4, 8, 2, true, 2.5};
  Tensor host = Tensor::from_floats({5, E}, v);
  for (DType dt : {DType::F32, DType::BF16}) {
    cpu::RouterOutput want = cpu::router_sigmoid_group_forward(host, Tensor(), r, false);
    cuda::RouterResult got =
        cuda::router_sigmoid_group_forward(test::device_from_host(host, dt), Tensor(), r, nullptr, stream0());
    EXPECT_EQ(host_ints(got.index), ints(want.index)) << dtype_safetensors_name(dt);
    const std::vector<float> gw = test::device_floats(got.weights), ww = want.weights.to_floats();
    for (size_t i = 0; i < gw.size(); ++i) {
      if (std::isnan(ww[i])) {
        EXPECT_TRUE(std::isnan(gw[i])) << "slot " << i;
        continue;
      }
      EXPECT_NEAR(gw[i], ww[i], 2e-6 * 2.5) << "slot " << i;
    }
  }
}

TEST(CudaRouterSigmoidGroup, BackwardMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 3500;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const int T = c.T, E = c.E, k = static_cast<int>(c.r.top_k);
    Inputs in = make_inputs(c, seed += 3);
    cpu::RouterOutput ref = cpu::router_sigmoid_group_forward(in.host_logits, in.host_bias, c.r, c.bf16_logits);
    Tensor dw = test::host_random({T, k}, seed + 2);
    const std::vector<float> want = cpu::router_sigmoid_group_backward(dw, ref, c.r).to_floats();
    const cuda::RouterResult route{cuda::to_device(ref.index, 0), Tensor()};
    for (DType out_dt : {DType::F32, DType::BF16}) {
      Tensor dl = Tensor::empty({T, E}, out_dt, Device::cuda(0));
      cuda::router_sigmoid_group_backward(cuda::to_device(dw, 0), in.dev_logits, route, c.r, dl, stream0());
      const std::vector<float> got = test::device_floats(dl);
      const bool f32 = out_dt == DType::F32;
      test::expect_norm(got, want, f32 ? 1e-5 : 6e-3, f32 ? 1e-6 : 3e-3, f32 ? "dlogits F32" : "dlogits BF16");
      size_t stray = 0;
      for (size_t i = 0; i < got.size(); ++i) stray += want[i] == 0.0f && got[i] != 0.0f;
      EXPECT_EQ(stray, 0u) << "gradient on experts that were not selected";
    }
  }
}

// The per-expert loads accumulated by the forward (over two calls, as over micro-batches) and by
// router_expert_load_add equal the CPU's count of the GPU's own ids.
TEST(CudaRouterSigmoidGroup, ExpertLoadsOnTheDevice) {
  MT_SKIP_WITHOUT_CUDA();
  for (const Case& c : {kCases[0], kCases[2], kCases[7], kCases[9]}) {
    SCOPED_TRACE(c.name);
    const int E = c.E;
    Tensor load = Tensor::zeros({E}, DType::I32);
    Tensor dev_load = cuda::to_device(load, 0);
    Tensor dev_load2 = cuda::to_device(load, 0);
    for (int call = 0; call < 2; ++call) {
      Inputs in = make_inputs(c, 3900 + call * 7);
      cuda::RouterResult got = cuda::router_sigmoid_group_forward(in.dev_logits, in.dev_bias, c.r, &dev_load, stream0());
      cuda::router_expert_load_add(got.index, dev_load2, stream0());
      cpu::router_expert_load_add(cuda::to_host(got.index), load);
    }
    EXPECT_EQ(host_ints(dev_load), ints(load));
    EXPECT_EQ(host_ints(dev_load2), ints(load));
    const std::vector<int32_t> l = ints(load);
    EXPECT_EQ(std::accumulate(l.begin(), l.end(), int64_t{0}), int64_t{2} * c.T * c.r.top_k);
  }
}

TEST(CudaRouterSigmoidGroup, ZeroTokensAndBadArguments) {
  MT_SKIP_WITHOUT_CUDA();
  const SigmoidGroupRouting r{8, 8, 4, true, 2.5};
  Tensor dev_load = cuda::to_device(Tensor::zeros({256}, DType::I32), 0);
  Tensor empty = Tensor::empty({0, 256}, DType::F32, Device::cuda(0));
  cuda::RouterResult got = cuda::router_sigmoid_group_forward(empty, Tensor(), r, &dev_load, stream0());
  EXPECT_EQ(got.index.shape(), Shape({0, 8}));
  Tensor dl = Tensor::empty({0, 256}, DType::F32, Device::cuda(0));
  cuda::router_sigmoid_group_backward(Tensor::empty({0, 8}, DType::F32, Device::cuda(0)), empty, got, r, dl, stream0());
  EXPECT_EQ(host_ints(dev_load), std::vector<int32_t>(256, 0));

  Tensor logits = test::device_from_host(test::host_random({4, 256}, 1), DType::F32);
  auto fwd = [&](SigmoidGroupRouting x) { return cuda::router_sigmoid_group_forward(logits, Tensor(), x, nullptr, stream0()); };
  EXPECT_THROW(fwd({8, 3, 1, true, 1.0}), Error);   // n_group does not divide E
  EXPECT_THROW(fwd({8, 8, 9, true, 1.0}), Error);   // topk_group > n_group
  EXPECT_THROW(fwd({33, 8, 2, true, 1.0}), Error);  // k > 32 (the kernel's limit)
  EXPECT_THROW(fwd({40, 1, 1, true, 1.0}), Error);  // k > 32
  EXPECT_THROW(fwd({33, 8, 1, true, 1.0}), Error);  // k > the kept experts
  EXPECT_THROW(fwd({0, 8, 4, true, 1.0}), Error);   // k 0
  EXPECT_THROW(cuda::router_sigmoid_group_forward(test::host_random({4, 256}, 1), Tensor(), r, nullptr, stream0()),
               Error);  // host logits
  EXPECT_THROW(cuda::router_sigmoid_group_forward(logits, test::host_random({256}, 2), r, nullptr, stream0()),
               Error);  // host bias
  EXPECT_THROW(cuda::router_sigmoid_group_forward(
                   logits, test::device_from_host(test::host_random({255}, 2), DType::F32), r, nullptr, stream0()),
               Error);  // bias shape
  Tensor bad_load = cuda::to_device(Tensor::zeros({255}, DType::I32), 0);
  EXPECT_THROW(cuda::router_sigmoid_group_forward(logits, Tensor(), r, &bad_load, stream0()), Error);
  Tensor big = Tensor::empty({1, 1032}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::router_sigmoid_group_forward(big, Tensor(), {8, 8, 4, true, 1.0}, nullptr, stream0()), Error);
  cuda::RouterResult ok = fwd(r);
  Tensor dl2 = Tensor::empty({4, 256}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::router_sigmoid_group_backward(cuda::to_device(Tensor::zeros({4, 7}, DType::F32), 0), logits, ok, r,
                                                   dl2, stream0()),
               Error);  // dweights shape
  EXPECT_THROW(cuda::router_sigmoid_group_backward(cuda::to_device(Tensor::zeros({4, 8}, DType::F32), 0), logits, ok,
                                                   {6, 8, 4, true, 2.5}, dl2, stream0()),
               Error);  // top_k unlike the index
}

}  // namespace
}  // namespace mt
