// Multi-tensor AdamW and the global gradient norm / clipping coefficient on the device.
// - F32 params and BF16 params with fp32 masters: the device runs torch's element math op by op with the
//   same fp32 roundings as the CPU optimizer (train/adamw.h), so parameters, masters and moments must be
//   bit-identical after several steps (the clip coefficient is taken from the device and applied to the
//   CPU gradients the way grad_clip_to does).
// - BF16 moments: compared with a scalar host emulation (the same math, moments rounded to bf16), exact.
// - Stochastic rounding: every result is one of the two bf16 neighbours of the fp32 update, the
//   rounding is unbiased (mean error within 3 standard errors of 0) and reproducible for a seed.
// - Grad norm: relative 1e-5 of the CPU's double-precision norm (fp32 partial sums on the device).
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/grad_norm.h"
#include "train/adamw.h"
#include "train/grad_clip.h"

namespace mt {
namespace {

const int64_t kSizes[] = {1, 0, 65537, 300, 7, 131072, 5, 1000, 64, 3, 2, 1, 17, 19, 23, 29, 31, 37, 41, 43,
                          47, 53, 59, 61, 67, 71, 100000, 9, 11, 13};  // 30 tensors: two launches

std::vector<std::string> names() {
  std::vector<std::string> n;
  for (size_t i = 0; i < std::size(kSizes); ++i) n.push_back(i % 4 == 1 ? "layers." + std::to_string(i) + ".input_layernorm.weight"
                                                                          : "layers." + std::to_string(i) + ".w");
  return n;
}

std::vector<float> bits_of(const Tensor& t) { return t.to_floats(); }

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (float_bits(a[i]) != float_bits(b[i]) && !bad++) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ, first at " << first << ": " << a[first] << " vs "
                     << b[first];
}

void run_exact(DType param_dt, DType grad_dt, bool clip) {
  const std::string what = std::string("param ") + (param_dt == DType::BF16 ? "bf16+master" : "f32") + " grad " +
                           (grad_dt == DType::BF16 ? "bf16" : "f32") + (clip ? " clipped" : "");
  auto& ctx = cuda::device_context(0);
  const std::vector<std::string> nm = names();
  std::vector<Tensor> host_p, dev_p;
  for (size_t i = 0; i < nm.size(); ++i) {
    Tensor p = test::host_random({kSizes[i]}, 10 + i, 0.5f, param_dt == DType::BF16).to(param_dt);
    host_p.push_back(p);
    dev_p.push_back(cuda::to_device(p, 0));
  }
  std::vector<std::pair<std::string, Tensor*>> hp, dp;
  for (size_t i = 0; i < nm.size(); ++i) hp.emplace_back(nm[i], &host_p[i]), dp.emplace_back(nm[i], &dev_p[i]);
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  AdamW cpu_opt(hp, o, adamw_hf_decays);
  cuda::CudaAdamWOptions co;
  co.hyper = o;
  cuda::CudaAdamW gpu_opt(dp, co, adamw_hf_decays, ctx.stream);
  Tensor norm = Tensor::empty({1}, DType::F32, Device::cuda(0)), coef = Tensor::empty({1}, DType::F32, Device::cuda(0));

  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> hg, dg;
    for (size_t i = 0; i < nm.size(); ++i) {
      Tensor g = test::host_random({kSizes[i]}, 1000 * step + i, 1.0f + step, grad_dt == DType::BF16);
      dg.push_back(test::device_from_host(g, grad_dt));
      hg.push_back(g);  // F32 holding the same values
    }
    std::vector<const Tensor*> dgp;
    for (auto& g : dg) dgp.push_back(&g);
    const double lr = o.lr * (1.0 - 0.2 * step);
    if (clip) {
      std::vector<Tensor*> hgp;
      for (auto& g : hg) hgp.push_back(&g);
      const double ref_norm = grad_global_norm(hgp);
      cuda::grad_norm_clip_coef(dgp, 10.0f, norm, coef, ctx.stream);
      const float got_norm = test::device_floats(norm)[0], got_coef = test::device_floats(coef)[0];
      EXPECT_NEAR(got_norm, ref_norm, 1e-5 * ref_norm) << what << " step " << step;
      EXPECT_NEAR(got_coef, std::min(1.0, 10.0 / (ref_norm + 1e-6)), 1e-5) << what;
      EXPECT_LT(got_coef, 1.0f) << what << ": the test should clip";
      for (auto& g : hg)  // the device's coefficient, applied as torch/grad_clip_to do
        for (float& v : std::span(g.data_as<float>(), g.numel())) v *= got_coef;
      gpu_opt.step(dgp, lr, &coef, ctx.stream);
    } else {
      gpu_opt.step(dgp, lr, nullptr, ctx.stream);
    }
    std::vector<const Tensor*> hgc;  // F32 holding the device gradients' values (bf16 ones are exact in fp32)
    for (auto& g : hg) hgc.push_back(&g);
    cpu_opt.step(hgc, lr);
  }
  for (size_t i = 0; i < nm.size(); ++i)
    expect_same_bits(test::device_floats(dev_p[i]), bits_of(host_p[i]), what + " " + nm[i]);
  auto hs = cpu_opt.named_state();
  auto ds = gpu_opt.named_state();
  ASSERT_EQ(hs.size(), ds.size());
  for (size_t i = 0; i < hs.size(); ++i) {
    EXPECT_EQ(hs[i].first, ds[i].first);
    expect_same_bits(test::device_floats(*ds[i].second), bits_of(*hs[i].second), what + " " + hs[i].first);
  }
}

TEST(CudaAdamW, MatchesCpuBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  run_exact(DType::F32, DType::F32, false);
  run_exact(DType::BF16, DType::F32, false);
  run_exact(DType::BF16, DType::BF16, false);
  run_exact(DType::F32, DType::F32, true);
  run_exact(DType::BF16, DType::F32, true);
}

// Host emulation of one torch AdamW element (the CPU optimizer's order), for the bf16 variants.
float lerp_torch(float self, float end, float w) {
  return std::abs(w) < 0.5f ? std::fma(w, end - self, self) : std::fma(-(end - self), 1.0f - w, end);
}
struct Scal {
  float decay_mul, w1, beta2, omb2, bc2s, eps, neg_step;
};
Scal scalars(const AdamWOptions& o, double lr, int64_t t, bool decay) {
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  return {decay ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f, static_cast<float>(1.0 - o.beta1),
          static_cast<float>(o.beta2), static_cast<float>(1.0 - o.beta2), static_cast<float>(std::sqrt(bc2)),
          static_cast<float>(o.eps), static_cast<float>(-(lr / bc1))};
}
float element(float p, float g, float& m, float& v, const Scal& s) {
  p = p * s.decay_mul;
  m = lerp_torch(m, g, s.w1);
  v = v * s.beta2;
  v = v + s.omb2 * g * g;
  return p + s.neg_step * m / (std::sqrt(v) / s.bc2s + s.eps);
}

TEST(CudaAdamW, Bf16MomentsMatchEmulation) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const int64_t n = 70000;
  Tensor p = test::host_random({n}, 5, 0.5f);
  Tensor dp = cuda::to_device(p, 0);
  std::vector<std::pair<std::string, Tensor*>> params{{"w", &dp}};
  cuda::CudaAdamWOptions co;
  co.hyper.lr = 1e-2;
  co.moment_dtype = DType::BF16;
  cuda::CudaAdamW opt(params, co, nullptr, ctx.stream);
  std::vector<float> pv = p.to_floats(), m(n, 0.0f), v(n, 0.0f);
  for (int step = 1; step <= 3; ++step) {
    Tensor g = test::host_random({n}, 50 + step, 1.0f);
    Tensor dg = cuda::to_device(g, 0);
    opt.step({&dg}, co.hyper.lr, nullptr, ctx.stream);
    const Scal s = scalars(co.hyper, co.hyper.lr, step, true);
    const std::vector<float> gv = g.to_floats();
    for (int64_t k = 0; k < n; ++k) {
      pv[k] = element(pv[k], gv[k], m[k], v[k], s);
      m[k] = round_bf16(m[k]);
      v[k] = round_bf16(v[k]);
    }
  }
  expect_same_bits(test::device_floats(dp), pv, "param");
  auto st = opt.named_state();
  EXPECT_EQ(st[0].second->dtype(), DType::BF16);
  expect_same_bits(test::device_floats(*st[0].second), m, "exp_avg");
  expect_same_bits(test::device_floats(*st[1].second), v, "exp_avg_sq");
}

TEST(CudaAdamW, StochasticRoundingIsUnbiasedAndReproducible) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const int64_t n = 200000;
  Tensor p = test::host_random({n}, 7, 1.0f, true);
  Tensor g = test::host_random({n}, 8, 1.0f);
  std::vector<float> results[2];
  for (int run = 0; run < 2; ++run) {
    Tensor dp = test::device_from_host(p, DType::BF16);
    std::vector<std::pair<std::string, Tensor*>> params{{"w", &dp}};
    cuda::CudaAdamWOptions co;
    co.hyper.lr = 1e-3;  // updates far below one bf16 step: plain rounding would mostly drop them
    co.bf16_master = false;
    co.seed = 1234;
    cuda::CudaAdamW opt(params, co, nullptr, ctx.stream);
    EXPECT_EQ(opt.named_state().size(), 2u) << "no master copy with stochastic rounding";
    Tensor dg = cuda::to_device(g, 0);
    opt.step({&dg}, co.hyper.lr, nullptr, ctx.stream);
    results[run] = test::device_floats(dp);
  }
  expect_same_bits(results[0], results[1], "same seed");
  AdamWOptions o;
  o.lr = 1e-3;
  const Scal s = scalars(o, o.lr, 1, true);
  const std::vector<float> pv = p.to_floats(), gv = g.to_floats();
  double err_sum = 0.0, err_sq = 0.0;
  int64_t outside = 0, moved = 0;
  for (int64_t k = 0; k < n; ++k) {
    float m = 0.0f, v = 0.0f;
    const float exact = element(pv[k], gv[k], m, v, s);
    const uint32_t b = float_bits(exact);
    const float lo = bits_float(b & 0xffff0000u), hi = bits_float((b & 0xffff0000u) + 0x10000u);
    const float got = results[0][k];
    const float a = std::min(lo, hi), z = std::max(lo, hi);
    if (!(got == lo || got == hi)) ++outside;
    if (got != pv[k]) ++moved;
    const double ulp = static_cast<double>(z) - a;
    const double e = (static_cast<double>(got) - exact) / ulp;
    err_sum += e;
    err_sq += e * e;
  }
  EXPECT_EQ(outside, 0) << "results that are not a bf16 neighbour of the fp32 update";
  const double mean = err_sum / n, sd = std::sqrt(err_sq / n - mean * mean);
  EXPECT_LT(std::fabs(mean), 4.0 * sd / std::sqrt(static_cast<double>(n))) << "biased rounding: mean error " << mean
                                                                             << " ulp";
  EXPECT_GT(moved, n / 20) << "stochastic rounding should move a share of the parameters";
}

TEST(CudaAdamW, GradNormEdgeCases) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  Tensor norm = Tensor::empty({1}, DType::F32, d), coef = Tensor::empty({1}, DType::F32, d);
  cuda::grad_norm_clip_coef({}, 1.0f, norm, coef, ctx.stream);
  EXPECT_EQ(test::device_floats(norm)[0], 0.0f);
  EXPECT_EQ(test::device_floats(coef)[0], 1.0f);
  Tensor g = cuda::to_device(Tensor::from_floats({2}, {3.0f, 4.0f}), 0);
  Tensor gb = test::device_from_host(Tensor::from_floats({1}, {12.0f}), DType::BF16);
  cuda::grad_norm_clip_coef({&g, &gb}, 0.0f, norm, coef, ctx.stream);  // max_norm 0: no clipping
  EXPECT_FLOAT_EQ(test::device_floats(norm)[0], 13.0f);
  EXPECT_EQ(test::device_floats(coef)[0], 1.0f);
  cuda::grad_norm_clip_coef({&g, &gb}, 6.5f, norm, coef, ctx.stream);
  EXPECT_NEAR(test::device_floats(coef)[0], 0.5f, 1e-6f);
}

TEST(CudaAdamW, RejectsMismatchedGradients) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  Tensor p = Tensor::empty({4}, DType::F32, Device::cuda(0));
  cuda::fill_zero_async(p, ctx.stream);
  std::vector<std::pair<std::string, Tensor*>> params{{"w", &p}};
  cuda::CudaAdamW opt(params, {}, nullptr, ctx.stream);
  Tensor g5 = Tensor::empty({5}, DType::F32, Device::cuda(0));
  EXPECT_THROW(opt.step({&g5}, 1e-3, nullptr, ctx.stream), Error);
  EXPECT_THROW(opt.step({}, 1e-3, nullptr, ctx.stream), Error);
  Tensor host = Tensor::empty({4}, DType::F32);
  EXPECT_THROW(opt.step({&host}, 1e-3, nullptr, ctx.stream), Error);
  EXPECT_EQ(opt.step_count(), 0);
}

}  // namespace
}  // namespace mt
