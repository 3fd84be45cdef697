// The CUDA engine against Transformers 5.17 at realistic shapes and real routing: a 2-layer slice of
// Qwen3-30B-A3B's shapes (hidden 2048, GQA 32/4 heads of dim 128, 128 experts top-8, vocabulary 151,936)
// with random weights, one micro-batch of 4,096 tokens in packed documents, made on the GPU machine by
// tools/hf_reference/make_realistic_fixture.py (too large to commit: the session script makes it and points
// MIXTUNE_HF_REALISTIC at it; scripts/gpu-session.sh stage hf-realistic). Checked: CE and aux loss, the
// logits (per token and overall), every parameter's gradient, and a 20-step pure-bf16 training trajectory
// (bf16 parameters and AdamW moments, stochastic rounding, bf16 expert gradients: `mixtune bench`'s headline
// mode) against Transformers training the same checkpoint on the same micro-batches.
//
// Tolerances, derived from Transformers' own bf16 rounding on this input. The fixture holds, for every
// quantity X, the distance n_X of Transformers' bf16 result from its fp32 result on the same weights (same
// batch; fp32 has none of bf16's roundings and routes by fp32 logits): that is what bf16 rounding does to X
// here, near-tie routing flips included. mixtune's CUDA engine rounds at Transformers' points
// (hf-numerics.md §1.1) plus flash attention's bf16 P and dS and other fp32 summation orders; allowing its own
// distance from the fp32 result to be twice Transformers', the triangle inequality bounds its distance from
// Transformers' bf16 result by 3·n_X. Floors (for quantities where n_X is tiny): one bf16 rounding (2^-8) of
// the normalised error, 1e-3 relative on the losses.
// Trajectory: step i's loss may differ from Transformers' bf16 loss by 3·G_i + 2^-8 relative, where
// G_i = max_{j<=i} |bf16_j − fp32_j| of Transformers' two runs (the divergence bf16 training itself shows by
// step i). Transformers' pure bf16 (torch AdamW, round to nearest) and ours (stochastic rounding) are two
// different bf16 trainings of the same model; both should stay as close to the fp32 run as rounding allows.
//
// Routing decisions, per MoE layer: a token whose fp32 router margin (its k-th minus its (k+1)-th logit in
// Transformers' fp32 run) exceeds 4·δ, δ = the largest distance of Transformers' bf16 logits of that token from
// the fp32 ones, cannot be flipped by rounding that moves each logit by at most 2δ (our allowance, as above): on
// such clear tokens mixtune must select fp32's experts. Allowed: 0.5% of them (outliers of our own rounding). At
// random init bf16 rounding flips a good share of the near-ties on both sides, which is why the gradient and
// logit checks alone cannot see a partial routing error; this check can.
// The routing check: with a fault injected (router.h's probe: one token in ten gets its 8th expert replaced
// by its 9th, the off-by-one a top-k bug gives) the comparison must fail somewhere; the test asserts it does
// and prints where.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../hf_fixture_util.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/router.h"
#include "models/causal_lm.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "train/cuda/cuda_train_step.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

constexpr double kFactor = 3.0;                // see the header
constexpr double kBf16Floor = 1.0 / 256.0;     // one bf16 rounding, 2^-8
constexpr double kLossFloor = 1e-3;            // relative
constexpr double kRoutingSlack = 0.005;        // of the clear tokens (see the header)

fs::path fixture_dir() {
  const char* e = std::getenv("MIXTUNE_HF_REALISTIC");
  return e && *e ? fs::path(e) : fs::path();
}

#define MT_NEED_FIXTURE(dir)                                                                               \
  MT_SKIP_WITHOUT_CUDA();                                                                                  \
  const fs::path dir = fixture_dir();                                                                      \
  if (dir.empty() || !fs::exists(dir / "meta.json"))                                                       \
    GTEST_SKIP() << "MIXTUNE_HF_REALISTIC names no fixture (tools/hf_reference/make_realistic_fixture.py)"

// One compared quantity: its error and the limit derived for it.
struct Check {
  std::string what;
  double err = 0, limit = 0;
  bool ok() const { return std::isfinite(err) && err <= limit; }
};

double limit_from(const nlohmann::json& noise, const char* stat) { return kFactor * noise[stat].get<double>() + kBf16Floor; }

void add_norm_checks(std::vector<Check>& out, const std::string& what, const std::vector<float>& got,
                     const std::vector<float>& want, const nlohmann::json& noise) {
  const test::ErrorStats s = test::error_stats(got, want);
  out.push_back({what + " max-norm", s.non_finite ? INFINITY : s.max_norm, limit_from(noise, "max_norm")});
  out.push_back({what + " rel-L2", s.non_finite ? INFINITY : s.rel_l2, limit_from(noise, "rel_l2")});
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

struct Loaded {
  nlohmann::json meta;
  CausalLM lm;
  ModelWeights dev;
};

Loaded load(const fs::path& dir) {
  Loaded l{test::read_json(dir / "meta.json"), CausalLM::from_pretrained((dir / "ckpt").string(), {DType::BF16}), {}};
  l.dev = ModelWeights::absent_like_config(l.lm.config, DType::BF16, Device::cuda(0));
  auto src = l.lm.weights.named_parameters();
  auto dst = l.dev.named_parameters();
  for (size_t i = 0; i < src.size(); ++i) *dst[i].second = cuda::to_device(*src[i].second, 0);
  return l;
}

// Loss, logits and every gradient of the fixture batch against Transformers' bf16 run.
std::vector<Check> compare_one_batch(const fs::path& dir, Loaded& l) {
  const DecoderSpec& cfg = l.lm.config;
  const nlohmann::json& noise = l.meta["noise"];
  SafetensorsFile bf = SafetensorsFile::open((dir / "batch.safetensors").string());
  const Batch b = test::load_batch(bf);
  const CudaBatch cb = cuda_batch_upload(cfg, b, 0);
  std::vector<Check> out;

  DecoderCudaModel model(cfg, l.dev, 0);
  ModelWeights grads = cuda_grad_buffers(cfg, DType::F32, 0);
  const double div = static_cast<double>(cb.target_count);
  CudaLoss loss = model.forward_backward(cb, grads, div);
  model.flush_expert_grads();
  const double ce = cuda::to_host(loss.ce_sum).to_floats()[0] / div;
  const double aux = cuda::to_host(loss.aux).to_floats()[0];
  const nlohmann::json &h16 = l.meta["bf16"], &h32 = l.meta["fp32"];
  out.push_back({"ce loss (relative)", rel(ce, h16["ce_loss"]),
                 kFactor * rel(h16["ce_loss"], h32["ce_loss"]) + kLossFloor});
  out.push_back({"aux loss (relative)", rel(aux, h16["aux_loss"]),
                 kFactor * rel(h16["aux_loss"], h32["aux_loss"]) + 2 * kBf16Floor});

  SafetensorsFile ref = SafetensorsFile::open((dir / "bf16.safetensors").string());
  const DecoderCudaModel::Trace trace = model.forward_trace(cb);
  for (int64_t layer = 0; layer < cfg.num_layers(); ++layer) {  // routing decisions (see the header)
    const std::string l = std::to_string(layer);
    const std::vector<float> l32 = ref.tensor("router_logits_fp32." + l).to_floats();
    const std::vector<float> l16 = ref.tensor("router_logits_bf16." + l).to_floats();
    const Tensor idx = cuda::to_host(trace.routes[static_cast<size_t>(layer)]);
    const int64_t T = cb.tokens(), E = cfg.num_experts(), k = cfg.experts_per_token();
    int64_t clear = 0, wrong = 0;
    std::vector<int> order(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      const float* r32 = l32.data() + t * E;
      double noise = 0;
      for (int64_t e = 0; e < E; ++e) noise = std::max(noise, std::fabs(double(l16[t * E + e]) - r32[e]));
      for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int>(e);
      std::partial_sort(order.begin(), order.begin() + k + 1, order.end(),
                        [&](int a, int b) { return r32[a] > r32[b] || (r32[a] == r32[b] && a < b); });
      if (double(r32[order[k - 1]]) - r32[order[k]] <= 4 * noise) continue;  // a near tie: rounding may flip it
      ++clear;
      std::vector<int> want(order.begin(), order.begin() + k), got(idx.data_as<int32_t>() + t * k,
                                                                   idx.data_as<int32_t>() + (t + 1) * k);
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
      wrong += got != want;
    }
    out.push_back({"layer " + l + " routing: clear tokens (" + std::to_string(clear) + ") with other experts",
                   clear ? static_cast<double>(wrong) / clear : 1.0, kRoutingSlack});
  }
  {  // logits = final_hidden · lm_headᵀ in bf16, as Transformers' lm_head computes them
    const Tensor& xf = trace.final_hidden;
    Tensor logits = Tensor::empty({cb.tokens(), cfg.vocab_size}, DType::BF16, Device::cuda(0));
    cuda::linear_forward(xf, cfg.tie_word_embeddings ? l.dev.embed : l.dev.lm_head, logits,
                         cuda::device_context(0).stream);
    const std::vector<float> got = test::device_floats(logits), want = ref.tensor("logits").to_floats();
    add_norm_checks(out, "logits", got, want, noise["logits"]);
    const int64_t V = cfg.vocab_size;
    double worst = 0;
    for (int64_t t = 0; t < cb.tokens(); ++t) {
      double d2 = 0, r2 = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double a = got[t * V + v], w = want[t * V + v];
        d2 += (a - w) * (a - w), r2 += w * w;
      }
      worst = std::max(worst, std::sqrt(d2 / std::max(r2, 1e-30)));
    }
    out.push_back({"logits worst token rel-L2", worst, kFactor * noise["logits_rows"]["max"].get<double>() + kBf16Floor});
  }
  for (auto& [name, g] : grads.named_parameters())
    add_norm_checks(out, "grad " + name, test::device_floats(*g), ref.tensor("grad." + name).to_floats(),
                    noise["grad." + name]);
  return out;
}

void print_checks(const std::vector<Check>& checks) {
  for (const Check& c : checks)
    std::printf("[ check    ] %-58s %10.3g  limit %10.3g  %s\n", c.what.c_str(), c.err, c.limit, c.ok() ? "" : "FAILS");
}

TEST(GpuVsTransformers, RealisticSliceMatchesTransformersBf16) {
  MT_NEED_FIXTURE(dir);
  Loaded l = load(dir);
  const std::vector<Check> checks = compare_one_batch(dir, l);
  print_checks(checks);
  for (const Check& c : checks) EXPECT_TRUE(c.ok()) << c.what << ": " << c.err << " > " << c.limit;
}

TEST(GpuVsTransformers, BrokenRoutingIsCaught) {
  MT_NEED_FIXTURE(dir);
  Loaded l = load(dir);
  cuda::set_routing_fault_probe(10);
  std::vector<Check> checks;
  try {
    checks = compare_one_batch(dir, l);
  } catch (...) {
    cuda::set_routing_fault_probe(0);
    throw;
  }
  cuda::set_routing_fault_probe(0);
  int failing = 0;
  for (const Check& c : checks) {
    failing += !c.ok();
    std::printf("[ %s ] %-58s %10.3g  limit %10.3g (x%.2f)\n", c.ok() ? "passes  " : "caught  ", c.what.c_str(), c.err,
                c.limit, c.err / c.limit);
  }
  EXPECT_GT(failing, 0) << "a top-k off-by-one on one token in ten passed every check";
}

TEST(GpuVsTransformers, PureBf16TrajectoryTracksTransformers) {
  MT_NEED_FIXTURE(dir);
  Loaded l = load(dir);
  const DecoderSpec& cfg = l.lm.config;
  const nlohmann::json& tr = l.meta["trajectory"];
  const std::vector<double> h16 = tr["bf16"], h32 = tr["fp32"];
  const nlohmann::json& hp = l.meta["optimizer"];
  CudaTrainStepOptions o;
  o.adamw.hyper = test::adamw_options(hp);
  o.adamw.hyper.master_weights = false;
  o.adamw.bf16_master = false;  // pure bf16: stochastic rounding into the bf16 parameters
  o.adamw.moment_dtype = DType::BF16;
  o.adamw.seed = 1234;
  o.expert_grad_dtype = DType::BF16;
  CudaTrainStep step(cfg, l.dev, 0, o);
  SafetensorsFile f = SafetensorsFile::open((dir / "trajectory.safetensors").string());
  double gap = 0, worst = 0;
  std::printf("[ traj     ] step  mixtune     hf-bf16     hf-fp32     |m-hf16|/limit\n");
  for (size_t i = 0; i < h16.size(); ++i) {
    Batch b;
    b.input_ids = f.tensor("input_ids." + std::to_string(i)).clone();
    b.labels = f.tensor("labels." + std::to_string(i)).clone();
    b.position_ids = f.tensor("position_ids." + std::to_string(i)).clone();
    const CudaBatch cb = cuda_batch_upload(cfg, b, 0);
    const EngineStep s = step.step({cb}, static_cast<double>(cb.target_count), hp["lr"].get<double>(),
                                   l.meta["max_grad_norm"].get<double>());
    gap = std::max(gap, std::fabs(h16[i] - h32[i]));
    const double limit = kFactor * gap + kBf16Floor * std::fabs(h16[i]);
    const double d = std::fabs(s.loss - h16[i]);
    worst = std::max(worst, d / limit);
    std::printf("[ traj     ] %4zu  %.6f  %.6f  %.6f  %.3f\n", i + 1, s.loss, h16[i], h32[i], d / limit);
    EXPECT_LE(d, limit) << "step " << i + 1 << ": mixtune " << s.loss << ", Transformers bf16 " << h16[i]
                        << ", fp32 " << h32[i];
  }
  std::printf("[ traj     ] worst |mixtune - hf bf16| / limit over %zu steps: %.3f; loss %.4f -> %.4f (hf fp32 %.4f -> "
              "%.4f)\n", h16.size(), worst, h16.front(), h16.back(), h32.front(), h32.back());
  EXPECT_LT(h16.back(), h16.front());  // the fixture trained: the comparison is not of two flat lines
}

}  // namespace
}  // namespace mt
