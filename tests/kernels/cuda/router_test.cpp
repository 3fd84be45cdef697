// CUDA fused routers (Qwen's softmax, top-k, renormalisation; GPT-OSS's top-k then softmax; aux statistics) and
// their backward against the CPU reference ops (kernels/cpu/router.h, aux_loss.h).
//
// Thresholds: the GPU softmax uses expf (a few ulp from glibc's) and sums in double like the CPU, so fp32
// results agree to ~1e-7 relative (limit 1e-5). Routing weights rounded to bf16 from nearly equal fp32
// values agree unless a value sits on a rounding boundary (one bf16 ulp, 2^-7: limit 1e-2). bf16 dlogits
// are rounded once (at most 2^-8 = 3.9e-3 of an element): limit 6e-3 (measured on an H200: 2.7e-3).
// Top-k ids are compared exactly except at near-ties (CPU probabilities within 1e-6 relative), which may
// order differently and are counted (at most 1% of tokens).
#include "kernels/cpu/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cpu/aux_loss.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/router.h"

namespace mt {
namespace {

cudaStream_t stream0() { return cuda::device_context(0).stream; }

struct RouterCase {
  int T, E, k;
  bool norm, bf16;
};

Tensor host_i32(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(s, DType::I32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

std::vector<int32_t> host_ints(const Tensor& dev) {
  Tensor h = cuda::to_host(dev);
  return {h.data_as<int32_t>(), h.data_as<int32_t>() + h.numel()};
}

// Logits as the GPU sees them (bf16 mode: BF16 tensor of bf16 values) and as the CPU sees them (F32).
struct Logits {
  Tensor host, dev;
};
Logits make_logits(const RouterCase& c, uint64_t seed) {
  Logits l;
  l.host = test::host_random({c.T, c.E}, seed, 2.0f, c.bf16);
  l.dev = test::device_from_host(l.host, c.bf16 ? DType::BF16 : DType::F32);
  return l;
}

// Number of tokens whose GPU top-k differs from the CPU's; fails on a difference that is not a near-tie.
int compare_topk(const std::vector<int32_t>& got, const std::vector<int32_t>& want, const float* probs, int T, int E,
                 int k) {
  int ties = 0;
  for (int t = 0; t < T; ++t) {
    bool same = true;
    for (int s = 0; s < k; ++s) same &= got[t * k + s] == want[t * k + s];
    if (same) continue;
    ++ties;
    for (int s = 0; s < k; ++s) {
      const float a = probs[t * E + got[t * k + s]], b = probs[t * E + want[t * k + s]];
      EXPECT_LE(std::fabs(a - b), 1e-6f * std::fabs(b) + 1e-30f)
          << "token " << t << " slot " << s << ": expert " << got[t * k + s] << " (p " << a << ") vs "
          << want[t * k + s] << " (p " << b << ")";
    }
  }
  return ties;
}

const RouterCase kCases[] = {
    {37, 8, 2, false, false},     // tiny, one lane per expert
    {513, 128, 8, true, true},    // Qwen3-30B-A3B: 128 experts, top-8, renormalised, bf16
    {301, 128, 8, true, false},   //   same in fp32
    {100, 60, 4, false, true},    // E not a multiple of 32
    {65, 256, 8, true, false},    // 8 experts per lane
    {20, 1000, 32, true, false},  // the limits: E up to 1024, k up to 32
    {3, 1, 1, true, true},        // a single expert
};

TEST(CudaRouter, ForwardMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 100;
  for (const RouterCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << " E " << c.E << " k " << c.k << " norm " << c.norm << " bf16 "
                                    << c.bf16);
    Logits l = make_logits(c, ++seed);
    cpu::RouterOutput want = cpu::router_forward(l.host, c.k, c.norm, c.bf16);
    cuda::RouterResult got = cuda::router_forward(l.dev, c.k, c.norm, c.bf16, nullptr, stream0());
    std::vector<int32_t> gi = host_ints(got.index);
    std::vector<int32_t> wi(want.index.data_as<int32_t>(), want.index.data_as<int32_t>() + c.T * c.k);
    const int ties = compare_topk(gi, wi, want.probs.data_as<float>(), c.T, c.E, c.k);
    EXPECT_LE(ties, c.T / 100 + 1);
    if (ties == 0)
      test::expect_norm(test::device_floats(got.weights), want.weights.to_floats(), c.bf16 ? 1e-2 : 1e-5,
                        c.bf16 ? 2e-3 : 1e-6, "routing weights");
    if (c.norm && !c.bf16) {
      std::vector<float> w = test::device_floats(got.weights);
      for (int t = 0; t < c.T; ++t) {
        double s = 0;
        for (int j = 0; j < c.k; ++j) s += w[t * c.k + j];
        EXPECT_NEAR(s, 1.0, 1e-5) << "token " << t;
      }
    }
  }
}

// The aux statistics over two "layers", then aux and its gradient, against cpu::aux_loss_*.
TEST(CudaRouter, AuxStatsAndBackwardMatchCpu) {
  MT_SKIP_WITHOUT_CUDA();
  for (bool bf16 : {false, true}) {
    for (bool norm : {false, true}) {
      SCOPED_TRACE(testing::Message() << "bf16 " << bf16 << " norm " << norm);
      const RouterCase c{517, 128, 8, norm, bf16};
      const int layers = 2;
      std::vector<Logits> ls;
      std::vector<Tensor> host_logits;
      for (int l = 0; l < layers; ++l) ls.push_back(make_logits(c, 900 + l)), host_logits.push_back(ls.back().host);
      cuda::AuxStats stats = cuda::aux_stats_zeros(c.E, 0, stream0());
      std::vector<cpu::RouterOutput> cpu_r;
      std::vector<cuda::RouterResult> gpu_r;
      for (int l = 0; l < layers; ++l) {
        cpu_r.push_back(cpu::router_forward(ls[l].host, c.k, norm, bf16));
        gpu_r.push_back(cuda::router_forward(ls[l].dev, c.k, norm, bf16, &stats, stream0()));
      }
      EXPECT_EQ(stats.rows, int64_t{layers} * c.T);

      // Counts and probability sums, recomputed on the host as load_balancing_loss_func does.
      std::vector<double> cnt(c.E, 0.0), psum(c.E, 0.0);
      for (int l = 0; l < layers; ++l) {
        std::vector<float> p(c.T * c.E);
        cpu::softmax_rows_f32(host_logits[l].data_as<float>(), c.T, c.E, p.data(), bf16);
        std::vector<int32_t> idx(c.k);
        for (int t = 0; t < c.T; ++t) {
          cpu::topk_row(&p[t * c.E], c.E, c.k, idx.data());
          for (int s = 0; s < c.k; ++s) cnt[idx[s]] += 1;
          for (int e = 0; e < c.E; ++e) psum[e] += p[t * c.E + e];
        }
      }
      std::vector<int32_t> gcnt = host_ints(stats.count);
      std::vector<float> gpsum = test::device_floats(stats.psum);
      double count_diff = 0;
      for (int e = 0; e < c.E; ++e) {
        count_diff += std::fabs(gcnt[e] - cnt[e]);
        EXPECT_NEAR(gpsum[e], psum[e], 1e-5 * layers * c.T) << "psum of expert " << e;
      }
      // A near-tie of rounded probabilities can move one selection; allow a handful.
      EXPECT_LE(count_diff, 2.0 * (bf16 ? 4 : 1)) << "aux top-k counts";

      cpu::AuxLossSaved saved;
      const double want_aux = cpu::aux_loss_forward(host_logits, c.k, bf16, &saved);
      const double daux = 0.37;
      Tensor aux, aux_dp;
      cuda::aux_loss_finish(stats, bf16, daux, aux, aux_dp, stream0());
      const float got_aux = test::device_floats(aux)[0];
      EXPECT_NEAR(got_aux, want_aux, (bf16 ? 2e-3 : 1e-5) * want_aux);
      EXPECT_GT(want_aux, 0.5 * c.k) << "random routing gives aux near k";

      // Backward: routing weights gradient + aux path, with the CPU's top-k ids on both sides.
      std::vector<Tensor> cpu_dl;
      for (int l = 0; l < layers; ++l) {
        Tensor dw = test::host_random({c.T, c.k}, 700 + l);
        cpu_dl.push_back(cpu::router_backward(dw, cpu_r[l], norm));
      }
      cpu::aux_loss_backward(daux, host_logits, saved, bf16, cpu_dl);
      for (int l = 0; l < layers; ++l) {
        Tensor dw = test::host_random({c.T, c.k}, 700 + l);
        cuda::RouterResult r{cuda::to_device(cpu_r[l].index, 0), Tensor()};
        for (DType out_dt : {DType::F32, DType::BF16}) {
          Tensor dl = Tensor::empty({c.T, c.E}, out_dt, Device::cuda(0));
          cuda::router_backward(cuda::to_device(dw, 0), ls[l].dev, r, norm, aux_dp, bf16, dl, stream0());
          test::expect_norm(test::device_floats(dl), cpu_dl[l].to_floats(), out_dt == DType::F32 ? 1e-5 : 6e-3,
                            out_dt == DType::F32 ? 1e-5 : 3e-3, "dlogits");
        }
      }
    }
  }
}

TEST(CudaRouter, BackwardWithoutAuxMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  for (const RouterCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << " E " << c.E << " k " << c.k);
    Logits l = make_logits(c, 55 + c.E);
    cpu::RouterOutput r = cpu::router_forward(l.host, c.k, c.norm, c.bf16);
    Tensor dw = test::host_random({c.T, c.k}, 56);
    Tensor want = cpu::router_backward(dw, r, c.norm);
    Tensor dl = Tensor::empty({c.T, c.E}, DType::F32, Device::cuda(0));
    cuda::router_backward(cuda::to_device(dw, 0), l.dev, {cuda::to_device(r.index, 0), Tensor()}, c.norm, Tensor(),
                          c.bf16, dl, stream0());
    test::expect_norm(test::device_floats(dl), want.to_floats(), 1e-5, 1e-5, "dlogits");
  }
}

// ---- GPT-OSS's router: top-k of the logits, softmax over the k (router_topk_softmax_*) ----
// The top-k reads the logits themselves, which are the same bits on both sides: the ids must agree exactly, ties
// included (bf16 logits tie often; the lower index wins on both). The weights' softmax over k values: expf a few
// ulp apart, the k-term sum in double on both sides: fp32 1e-5 / 1e-6; bf16 weights one bf16 step (2^-8 of a
// value <= 1) where a rounding boundary sits between: 1e-2 / 2e-3, as above.

const RouterCase kTopkSoftmaxCases[] = {
    {37, 8, 2, false, false},    // tiny
    {513, 32, 4, false, true},   // gpt-oss-20b: 32 experts, top-4, bf16
    {301, 128, 4, false, false}, // gpt-oss-120b: 128 experts, fp32
    {100, 60, 4, false, true},   // E not a multiple of 32
    {20, 1000, 32, false, false},// the limits
    {3, 1, 1, false, true},      // a single expert: weight 1
};

TEST(CudaRouterTopkSoftmax, ForwardMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 1200;
  for (const RouterCase& c : kTopkSoftmaxCases) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << " E " << c.E << " k " << c.k << " bf16 " << c.bf16);
    Logits l = make_logits(c, ++seed);
    cpu::RouterOutput want = cpu::router_topk_softmax_forward(l.host, c.k, c.bf16);
    cuda::RouterResult got = cuda::router_topk_softmax_forward(l.dev, c.k, c.bf16, nullptr, stream0());
    std::vector<int32_t> wi(want.index.data_as<int32_t>(), want.index.data_as<int32_t>() + c.T * c.k);
    EXPECT_EQ(host_ints(got.index), wi) << "top-k ids";
    test::expect_norm(test::device_floats(got.weights), want.weights.to_floats(), c.bf16 ? 1e-2 : 1e-5,
                      c.bf16 ? 2e-3 : 1e-6, "routing weights");
  }
}

// Exact ties: equal logits go to the lower index, in the top-k and at its boundary, as on the CPU.
TEST(CudaRouterTopkSoftmax, TiesGoToTheLowerIndex) {
  MT_SKIP_WITHOUT_CUDA();
  const int E = 40, k = 3;
  std::vector<float> v(4 * E, -1.0f);
  for (int e = 0; e < E; ++e) v[0 * E + e] = 0.5f;  // all equal: 0, 1, 2; weights 1/3
  v[1 * E + 5] = 3, v[1 * E + 9] = 3, v[1 * E + 37] = 3, v[1 * E + 2] = 3;  // four-way tie for three places
  v[2 * E + 33] = 2, v[2 * E + 1] = 1, v[2 * E + 20] = 1, v[2 * E + 39] = 1;  // a tie at the boundary
  v[3 * E + 39] = 5, v[3 * E + 38] = 5, v[3 * E + 0] = 4;  // ties in the last lanes' second slot
  Tensor host = Tensor::from_floats({4, E}, v);
  for (bool bf16 : {false, true}) {
    cpu::RouterOutput want = cpu::router_topk_softmax_forward(host, k, bf16);
    cuda::RouterResult got = cuda::router_topk_softmax_forward(
        test::device_from_host(host, bf16 ? DType::BF16 : DType::F32), k, bf16, nullptr, stream0());
    const std::vector<int32_t> gi = host_ints(got.index);
    EXPECT_EQ(gi, std::vector<int32_t>(want.index.data_as<int32_t>(), want.index.data_as<int32_t>() + 4 * k));
    EXPECT_EQ(gi, std::vector<int32_t>({0, 1, 2, 2, 5, 9, 33, 1, 20, 38, 39, 0})) << "bf16 " << bf16;
    const std::vector<float> gw = test::device_floats(got.weights);
    EXPECT_NEAR(gw[0], 1.0f / 3, bf16 ? 2e-3 : 1e-7);
    EXPECT_EQ(gw[0], gw[1]);
    EXPECT_EQ(gw[1], gw[2]);
  }
}

// The aux statistics (the full softmax of the logits and its own top-k, as HF's aux loss reads GPT-OSS's router
// logits) over two layers, then aux and the backward with the aux path, against cpu::router_topk_softmax_* and
// cpu::aux_loss_* (what the CPU model runs for RouterScore::topk_softmax).
TEST(CudaRouterTopkSoftmax, AuxStatsAndBackwardMatchCpu) {
  MT_SKIP_WITHOUT_CUDA();
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(testing::Message() << "bf16 " << bf16);
    const RouterCase c{517, 32, 4, false, bf16};
    const int layers = 2;
    std::vector<Logits> ls;
    std::vector<Tensor> host_logits;
    for (int l = 0; l < layers; ++l) ls.push_back(make_logits(c, 1900 + l)), host_logits.push_back(ls.back().host);
    cuda::AuxStats stats = cuda::aux_stats_zeros(c.E, 0, stream0());
    std::vector<cpu::RouterOutput> cpu_r;
    for (int l = 0; l < layers; ++l) {
      cpu_r.push_back(cpu::router_topk_softmax_forward(ls[l].host, c.k, bf16));
      cuda::router_topk_softmax_forward(ls[l].dev, c.k, bf16, &stats, stream0());
    }
    EXPECT_EQ(stats.rows, int64_t{layers} * c.T);
    std::vector<double> cnt(c.E, 0.0), psum(c.E, 0.0);
    for (int l = 0; l < layers; ++l) {
      std::vector<float> p(c.T * c.E);
      cpu::softmax_rows_f32(host_logits[l].data_as<float>(), c.T, c.E, p.data(), bf16);
      std::vector<int32_t> idx(c.k);
      for (int t = 0; t < c.T; ++t) {
        cpu::topk_row(&p[t * c.E], c.E, c.k, idx.data());
        for (int s = 0; s < c.k; ++s) cnt[idx[s]] += 1;
        for (int e = 0; e < c.E; ++e) psum[e] += p[t * c.E + e];
      }
    }
    std::vector<int32_t> gcnt = host_ints(stats.count);
    std::vector<float> gpsum = test::device_floats(stats.psum);
    double count_diff = 0;
    for (int e = 0; e < c.E; ++e) {
      count_diff += std::fabs(gcnt[e] - cnt[e]);
      EXPECT_NEAR(gpsum[e], psum[e], 1e-5 * layers * c.T) << "psum of expert " << e;
    }
    EXPECT_LE(count_diff, 2.0 * (bf16 ? 4 : 1)) << "aux top-k counts";

    cpu::AuxLossSaved saved;
    const double want_aux = cpu::aux_loss_forward(host_logits, c.k, bf16, &saved);
    const double daux = 0.37;
    Tensor aux, aux_dp;
    cuda::aux_loss_finish(stats, bf16, daux, aux, aux_dp, stream0());
    EXPECT_NEAR(test::device_floats(aux)[0], want_aux, (bf16 ? 2e-3 : 1e-5) * want_aux);

    std::vector<Tensor> cpu_dl;
    for (int l = 0; l < layers; ++l)
      cpu_dl.push_back(cpu::router_topk_softmax_backward(test::host_random({c.T, c.k}, 1700 + l), cpu_r[l]));
    cpu::aux_loss_backward(daux, host_logits, saved, bf16, cpu_dl);
    for (int l = 0; l < layers; ++l) {
      Tensor dw = test::host_random({c.T, c.k}, 1700 + l);
      cuda::RouterResult r{cuda::to_device(cpu_r[l].index, 0), Tensor()};
      for (DType out_dt : {DType::F32, DType::BF16}) {
        Tensor dl = Tensor::empty({c.T, c.E}, out_dt, Device::cuda(0));
        cuda::router_topk_softmax_backward(cuda::to_device(dw, 0), ls[l].dev, r, aux_dp, bf16, dl, stream0());
        test::expect_norm(test::device_floats(dl), cpu_dl[l].to_floats(), out_dt == DType::F32 ? 1e-5 : 6e-3,
                          out_dt == DType::F32 ? 1e-5 : 3e-3, "dlogits");
      }
    }
  }
}

// Without the aux path: the gradient is the k-way softmax's, on the selected experts only (others exactly 0).
TEST(CudaRouterTopkSoftmax, BackwardWithoutAuxMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  for (const RouterCase& c : kTopkSoftmaxCases) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << " E " << c.E << " k " << c.k << " bf16 " << c.bf16);
    Logits l = make_logits(c, 1500 + c.E);
    cpu::RouterOutput r = cpu::router_topk_softmax_forward(l.host, c.k, c.bf16);
    Tensor dw = test::host_random({c.T, c.k}, 1501);
    Tensor want = cpu::router_topk_softmax_backward(dw, r);
    Tensor dl = Tensor::empty({c.T, c.E}, DType::F32, Device::cuda(0));
    cuda::router_topk_softmax_backward(cuda::to_device(dw, 0), l.dev, {cuda::to_device(r.index, 0), Tensor()}, Tensor(),
                                       c.bf16, dl, stream0());
    const std::vector<float> got = test::device_floats(dl), wv = want.to_floats();
    test::expect_norm(got, wv, 1e-5, 1e-5, "dlogits");
    size_t stray = 0;
    for (size_t i = 0; i < got.size(); ++i) stray += wv[i] == 0.0f && got[i] != 0.0f;
    EXPECT_EQ(stray, 0u) << "gradient on experts that were not selected";
  }
}

TEST(CudaRouterTopkSoftmax, ZeroTokensAndBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor empty = Tensor::empty({0, 32}, DType::BF16, Device::cuda(0));
  cuda::AuxStats stats = cuda::aux_stats_zeros(32, 0, stream0());
  cuda::RouterResult r = cuda::router_topk_softmax_forward(empty, 4, true, &stats, stream0());
  EXPECT_EQ(r.index.shape(), Shape({0, 4}));
  EXPECT_EQ(stats.rows, 0);
  Tensor dl = Tensor::empty({0, 32}, DType::F32, Device::cuda(0));
  cuda::router_topk_softmax_backward(Tensor::empty({0, 4}, DType::F32, Device::cuda(0)), empty, r, Tensor(), true, dl,
                                     stream0());
  Tensor logits = test::device_from_host(test::host_random({4, 16}, 1), DType::F32);
  EXPECT_THROW(cuda::router_topk_softmax_forward(logits, 17, false, nullptr, stream0()), Error);  // k > E
  EXPECT_THROW(cuda::router_topk_softmax_forward(logits, 0, false, nullptr, stream0()), Error);   // k = 0
}

TEST(CudaRouter, ZeroTokensAndBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor empty = Tensor::empty({0, 16}, DType::F32, Device::cuda(0));
  cuda::AuxStats stats = cuda::aux_stats_zeros(16, 0, stream0());
  cuda::RouterResult r = cuda::router_forward(empty, 4, true, false, &stats, stream0());
  EXPECT_EQ(r.index.shape(), Shape({0, 4}));
  Tensor aux, aux_dp;
  cuda::aux_loss_finish(stats, false, 1.0, aux, aux_dp, stream0());
  EXPECT_EQ(test::device_floats(aux)[0], 0.0f);
  Tensor logits = test::device_from_host(test::host_random({4, 16}, 1), DType::F32);
  EXPECT_THROW(cuda::router_forward(logits, 17, true, false, nullptr, stream0()), Error);  // k > E
  EXPECT_THROW(cuda::router_forward(logits, 33, true, false, nullptr, stream0()), Error);  // k > 32
  EXPECT_THROW(cuda::router_forward(test::host_random({4, 16}, 1), 2, true, false, nullptr, stream0()),
               Error);  // host tensor
  Tensor big = Tensor::empty({1, 1025}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::router_forward(big, 2, true, false, nullptr, stream0()), Error);
}

// The bench's balanced-routing probe: after a real router pass, every token's k routes are distinct and every
// expert gets exactly T·k/E of them; the probe is off unless a bench turns it on.
TEST(CudaRouter, BalancedProbeGivesEveryExpertTheSameRows) {
  MT_SKIP_WITHOUT_CUDA();
  EXPECT_FALSE(cuda::balanced_routing_probe());
  const RouterCase c{96, 128, 8, true, true};
  Logits l = make_logits(c, 7);
  cuda::RouterResult r = cuda::router_forward(l.dev, c.k, c.norm, c.bf16, nullptr, stream0());
  cuda::router_force_balanced(r, c.E, stream0());
  const std::vector<int32_t> idx = host_ints(r.index);
  std::vector<int> rows(c.E, 0);
  for (int t = 0; t < c.T; ++t) {
    std::vector<int32_t> mine(idx.begin() + t * c.k, idx.begin() + (t + 1) * c.k);
    std::sort(mine.begin(), mine.end());
    EXPECT_EQ(std::adjacent_find(mine.begin(), mine.end()), mine.end()) << "token " << t << " routed twice";
    for (int32_t e : mine) {
      ASSERT_GE(e, 0);
      ASSERT_LT(e, c.E);
      ++rows[e];
    }
  }
  for (int e = 0; e < c.E; ++e) EXPECT_EQ(rows[e], c.T * c.k / c.E) << "expert " << e;
  EXPECT_THROW(cuda::router_force_balanced(r, 4, stream0()), Error);  // k > E
}

}  // namespace
}  // namespace mt
