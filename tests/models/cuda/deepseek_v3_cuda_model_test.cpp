// The CUDA model on DeepSeek-V3 configurations (tests/models/cuda/dsv3_cuda_test_util.h: MLA, a dense first layer,
// then MoE layers with the sigmoid group router, fp32 routing weights and a shared expert) against the CPU reference
// model, both with BF16 parameters (the CPU at Transformers' bf16 rounding points): loss and every parameter gradient
// of one micro-batch with packed documents and ignored labels (cuda_model_test_util.h test_batch), at DeepSeek-V3's
// MLA head sizes (192 / 128) and at the fixtures' (32 / 16, the value zero-padded for flash attention); the recompute
// policies against each other; LoRA on every MLA projection, the shared expert and the experts against the CPU.
//
// Thresholds (the derivations of tests/models/cuda/qwen3_moe_cuda_model_test.cpp, which this follows):
// - every expert routed (n_group = topk_group = 1, top-k = E): no routing decision can flip, so what remains is bf16
//   activations on both sides with other accumulation orders and rounding points: loss 5e-3 relative, gradients
//   0.06 max-norm / 0.03 rel-L2 (the router's 0.1 / 0.06: its gradient goes through the routing weights' dot products
//   over H and the sigmoid's derivative, here of bf16 d(logits) on the GPU, fp32 on the CPU);
// - top-2 in 4 groups (keep 2): near-ties that bf16 noise flips route a token elsewhere: 0.35 / 0.2, as there, each
//   raised to 3x the CPU bf16 gradient's own distance from the CPU fp32 one (the same bf16 weights) where larger: the
//   CPU flips on its own bf16 noise as much (measured on this configuration: router gradients 0.22 / 0.17 and
//   0.22 / 0.20 max-norm / rel-L2 on the two MoE layers between CPU bf16 and fp32; the GPU was 0.29 / 0.19 and
//   0.22 / 0.21 from the CPU bf16), so a fixed limit would test the draw of near-ties, not the kernels. With every
//   expert routed that distance is small and the fixed limits hold.
// - recompute none | selective | full: the forward is deterministic (same loss bits); the recomputed tensors are
//   bitwise the forward's, only the flash backward's fp32 atomics may reorder sums: 2e-3 / 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../../kernels/cuda/error_report.h"
#include "core/error.h"
#include "cuda_model_test_util.h"
#include "dsv3_cuda_test_util.h"
#include "kernels/cuda/device_copy.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/cuda_lora.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"
#include "models/lora_adapter.h"
#include "models/presets.h"
#include "models/registry.h"
#include "train/cuda/cuda_train_step.h"

namespace mt {
namespace {

using test::CudaRun;
using test::randomise_correction_bias;
using test::run_cuda;
using test::MlaGeometry;
using test::test_batch;
using test::to_device_weights;

MlaGeometry padded_geometry() {
  MlaGeometry g;
  g.heads = 4, g.nope = 24, g.rope = 8, g.v = 16, g.q_lora = 16, g.kv_lora = 16;
  return g;
}

// Every expert routed: one group, top-k = E.
DecoderSpec all_routed(const MlaGeometry& g) {
  nlohmann::json j = test::dsv3_test_json(g, 3, 1);
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 8;
  return DecoderSpec::from_json(j, "dsv3 all routed");
}

void expect_matches_cpu(const DecoderSpec& cfg, double loss_tol, test::GradLimit lim) {
  ASSERT_EQ(cuda_model_unsupported_reason(cfg), "");
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 7);
  randomise_correction_bias(host_w, 70);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  ModelWeights cpu_g = ModelWeights::zeros_like_config(cfg, DType::F32);
  const ForwardResult want = DecoderModel(cfg, host_w).forward_backward(b, cpu_g);
  ASSERT_GT(want.tokens, 0);
  ModelWeights w32 = host_w;  // the same bf16 values as F32: the CPU model in fp32, for bf16's own distance
  for (auto& [name, t] : w32.named_parameters()) *t = t->to(DType::F32);
  ModelWeights cpu32_g = ModelWeights::zeros_like_config(cfg, DType::F32);
  DecoderModel(cfg, w32).forward_backward(b, cpu32_g);
  const CudaRun got = run_cuda(cfg, dev_w, b, Recompute::none, static_cast<double>(want.tokens));
  EXPECT_EQ(got.count, want.tokens);
  EXPECT_FALSE(got.aux);  // DeepSeek-V3 adds no load-balancing loss
  EXPECT_NEAR(got.ce, want.ce_loss, loss_tol * want.ce_loss);
  {  // forward() agrees with forward_backward's loss
    DecoderCudaModel m(cfg, dev_w, 0);
    const CudaLoss l = m.forward(cuda_batch_upload(cfg, b, 0));
    EXPECT_NEAR(cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(want.tokens), got.ce, 1e-5 * got.ce);
  }
  bool saw_shared = false, saw_mla = false;
  for (const auto& [name, t] : cpu_g.named_parameters()) {
    saw_shared |= name.find("shared_experts") != std::string::npos;
    saw_mla |= name.find("kv_b_proj") != std::string::npos;
  }
  EXPECT_TRUE(saw_shared && saw_mla);
  auto want_p = cpu_g.named_parameters();
  auto fp32_p = cpu32_g.named_parameters();
  test::expect_gradients_near(got.grads, cpu_g, [&](size_t i, const std::string& name) {
    const test::ErrorStats noise = test::error_stats(want_p[i].second->to_floats(), fp32_p[i].second->to_floats());
    const test::GradLimit l = test::router_limit(name, lim);
    return test::GradLimit{std::max(l.max_norm, 3 * noise.max_norm), std::max(l.rel_l2, 3 * noise.rel_l2)};
  });
  // The correction bias is a buffer: the device copy is untouched.
  for (size_t l = 0; l < host_w.layers.size(); ++l)
    if (host_w.layers[l].router_score_bias.defined()) {
      EXPECT_EQ(test::device_floats(dev_w.layers[l].router_score_bias), host_w.layers[l].router_score_bias.to_floats());
    }
}

TEST(CudaDeepseekV3, MatchesCpuBf16AllExpertsRouted) {
  MT_SKIP_WITHOUT_CUDA();
  SCOPED_TRACE("192/128");
  expect_matches_cpu(all_routed(MlaGeometry{}), 5e-3, {0.06, 0.03});
}

TEST(CudaDeepseekV3, PaddedValueMatchesCpuBf16AllExpertsRouted) {
  MT_SKIP_WITHOUT_CUDA();
  expect_matches_cpu(all_routed(padded_geometry()), 5e-3, {0.06, 0.03});
}

TEST(CudaDeepseekV3, PlainQueryProjectionMatchesCpuBf16AllExpertsRouted) {
  MT_SKIP_WITHOUT_CUDA();
  MlaGeometry g;
  g.q_lora = 0;
  expect_matches_cpu(all_routed(g), 5e-3, {0.06, 0.03});
}

TEST(CudaDeepseekV3, MatchesCpuBf16GroupLimitedTopTwo) {
  MT_SKIP_WITHOUT_CUDA();
  expect_matches_cpu(DecoderSpec::from_json(test::dsv3_test_json(MlaGeometry{}, 3, 1), "dsv3 top-2"), 5e-3,
                     {0.35, 0.2});
}

TEST(CudaDeepseekV3, RecomputePoliciesAgree) {
  MT_SKIP_WITHOUT_CUDA();
  for (const MlaGeometry& g : {MlaGeometry{}, padded_geometry()}) {
    const DecoderSpec cfg = DecoderSpec::from_json(test::dsv3_test_json(g, 3, 1), "dsv3");
    ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 11);
    ModelWeights dev_w = to_device_weights(host_w);
    const Batch b = test_batch(cfg);
    const CudaRun none = run_cuda(cfg, dev_w, b, Recompute::none, 100.0);
    for (Recompute rc : {Recompute::selective, Recompute::full}) {
      SCOPED_TRACE(recompute_name(rc));
      const CudaRun r = run_cuda(cfg, dev_w, b, rc, 100.0);
      EXPECT_EQ(r.ce, none.ce);
      test::expect_gradients_near(r.grads, none.grads, {2e-3, 1e-3});
    }
  }
}

// The CUDA engine's refusals name what it cannot run, in one line.
TEST(CudaDeepseekV3, UnsupportedReasonNamesTheHeadSizes) {
  MlaGeometry g;
  g.nope = 120;  // qk 184
  const DecoderSpec cfg = DecoderSpec::from_json(test::dsv3_test_json(g, 2, 1), "t");
  const std::string why = cuda_model_unsupported_reason(cfg);
  EXPECT_NE(why.find("multi-head latent attention"), std::string::npos) << why;
  EXPECT_NE(why.find("184"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  for (const char* preset : {"deepseek-v3", "moonlight-16b-a3b"})
    EXPECT_EQ(cuda_model_unsupported_reason(DecoderSpec::from_json(preset_config_json(preset), preset)), "") << preset;
}

// ---- LoRA: the rule of tests/models/cuda/lora_cuda_model_test.cpp (its helpers, repeated here for this family) ----

// PEFT's init, then B drawn too (std b_std), so the adapter changes the model and every path is exercised.
LoraWeights adapter_for(const DecoderSpec& cfg, int64_t r, float b_std) {
  LoraConfig c;
  c.r = r;
  c.alpha = 2.0 * r;
  const bool q_lora = cfg.attention.at(0).q_lora_rank > 0;  // q_proj, or q_a_proj and q_b_proj
  for (const LoraTargetDef& d : lora_targets_of(cfg))
    if (d.name != (q_lora ? "q_proj" : "q_a_proj") && d.name != (q_lora ? "q_proj" : "q_b_proj"))
      c.target.push_back(d.name);
  auto table = std::make_shared<const LoraTable>(lora_table_of(cfg, c, "test"));
  LoraWeights l = LoraWeights::init(std::move(table), cfg.num_layers(), 17);
  std::mt19937_64 g(23);
  std::normal_distribution<float> d(0.0f, b_std);
  for (const LoraEntry& e : l.table->entries) {
    if (!e.is_b) continue;
    Tensor& b = l.slot(e);
    for (int64_t i = 0; i < b.numel(); ++i) b.data_as<float>()[i] = d(g);
  }
  return l;
}

struct LoraCpuRun {
  ForwardResult r;
  ModelWeights grads;
  LoraWeights lora_grads;
};

LoraCpuRun lora_cpu_run(const DecoderSpec& cfg, ModelWeights& w, const LoraWeights& adapter, const Batch& b) {
  ModelOptions o;
  o.lora = &adapter;
  DecoderModel m(cfg, w, o);
  LoraCpuRun run;
  run.grads = lora_base_grads(cfg, *adapter.table);
  run.lora_grads = LoraWeights::zeros(adapter.table, cfg.num_layers());
  run.r = m.forward_backward(b, run.grads, run.lora_grads);
  return run;
}

// Every adapter gradient and the router's (trained in full) within the all-routed limits (0.06 / 0.03, the router
// 0.1 / 0.06), or 3x the CPU bf16 model's own distance from its fp32 run where that is larger (the GPU's bf16 noise is
// of the same kind; 3x leaves room for the adapters' bf16 working copies, kernels/cuda/lora.h); loss 5e-3.
TEST(CudaDeepseekV3, LoraMatchesCpuBf16) {
  MT_SKIP_WITHOUT_CUDA();
  for (const MlaGeometry& geo : {MlaGeometry{}, padded_geometry()}) {
    SCOPED_TRACE(geo.nope + geo.rope == 192 ? "192/128" : "32/16");
    const DecoderSpec cfg = all_routed(geo);
    ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 7);
    const LoraWeights adapter = adapter_for(cfg, 8, 0.02f);
    const Batch b = test_batch(cfg);
    ModelWeights w32 = host_w;
    for (auto& [name, t] : w32.named_parameters()) *t = t->to(DType::F32);
    const LoraCpuRun want = lora_cpu_run(cfg, host_w, adapter, b), want32 = lora_cpu_run(cfg, w32, adapter, b);
    ASSERT_GT(want.r.tokens, 0);

    ModelWeights dev_w = to_device_weights(host_w);
    const CudaLora lora(adapter, 0);
    CudaModelOptions o;
    o.loss_chunk_rows = 64;
    o.lora = &lora.working();
    DecoderCudaModel model(cfg, dev_w, 0, o);
    const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
    ModelWeights grads = cuda_lora_base_grads(cfg, *lora.masters().table, 0);
    LoraWeights lora_grads = lora.zero_grads();
    const CudaLoss l = model.forward_backward(gb, grads, lora_grads, static_cast<double>(want.r.tokens));
    EXPECT_NEAR(cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(want.r.tokens), want.r.ce_loss,
                5e-3 * want.r.ce_loss);

    auto within = [](const std::string& what, const std::vector<float>& got, const std::vector<float>& w,
                     const std::vector<float>& w32v, test::GradLimit lim) {
      const test::ErrorStats noise = test::error_stats(w, w32v);
      test::expect_norm(got, w, std::max(lim.max_norm, 3 * noise.max_norm), std::max(lim.rel_l2, 3 * noise.rel_l2),
                        what);
    };
    const auto gg = grads.named_parameters();
    const auto wg = want.grads.named_parameters();
    const auto wg32 = want32.grads.named_parameters();
    ASSERT_EQ(gg.size(), wg.size());
    int full = 0;
    for (size_t i = 0; i < gg.size(); ++i) {
      ASSERT_EQ(gg[i].second->defined(), wg[i].second->defined()) << gg[i].first;
      if (!gg[i].second->defined()) continue;
      ++full;
      within(gg[i].first, test::floats_of(*gg[i].second), wg[i].second->to_floats(), wg32[i].second->to_floats(),
             {0.1, 0.06});
    }
    EXPECT_GT(full, 0) << "no router gradient was compared";
    const auto ga = lora_grads.named_parameters();
    const auto wa = want.lora_grads.named_parameters();
    const auto wa32 = want32.lora_grads.named_parameters();
    ASSERT_EQ(ga.size(), wa.size());
    bool saw_mla = false, saw_shared = false;
    for (size_t i = 0; i < ga.size(); ++i) {
      ASSERT_EQ(ga[i].first, wa[i].first);
      saw_mla |= ga[i].first.find("kv_b_proj") != std::string::npos;
      saw_shared |= ga[i].first.find("shared_experts") != std::string::npos;
      within("adapter gradient " + ga[i].first, test::device_floats(*ga[i].second), wa[i].second->to_floats(),
             wa32[i].second->to_floats(), {0.06, 0.03});
    }
    EXPECT_TRUE(saw_mla && saw_shared);
  }
}

}  // namespace
}  // namespace mt
