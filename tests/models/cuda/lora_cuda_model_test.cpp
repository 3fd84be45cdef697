// The CUDA model with a LoRA adapter (models/cuda/cuda_lora.h, CudaModelOptions::lora) against the CPU model with the
// same adapter (ModelOptions::lora), both over BF16 parameters: loss, logits, the adapter's A/B gradients on every
// adapted slot (attention, dense MLP, experts, the Mamba2 mixer's in_proj) and the router's (trained in
// full); Qwen3-MoE with a dense layer, GPT-OSS (biases, sinks, clamped experts: all frozen) and Nemotron-H
// (nemotron_h_cuda_test_util.h: Mamba2, NoPE attention, ReLU² MLP, shared and routed experts; under each recompute
// policy too). The frozen base gets no gradient buffer on either side. B = 0 (PEFT's init) gives the base model's
// loss and final hidden state bit for bit on the GPU; the recompute policies agree with each other (Nemotron-H with
// train.deterministic: bit for bit).
//
// Limits: every model routes every expert (top-k = E), so no routing decision can flip and what remains is bf16
// activations with different accumulation orders and rounding points. (Nemotron-H at its top-2 of 8 flipped
// near-ties between the engines on an H100, session 37: one token's logits 0.41 apart, the routers' gradients 0.18
// rel-L2 and, through them, every adapter gradient ~1.1-1.8x its limit; routing itself is CudaNemotronH.*'s.) The adapter's
// gradients are weight gradients of the same form as the base's (Σ over tokens of a bf16 activation times a bf16
// output gradient, dA through one more bf16 GEMM output du), so they get the base gradients' limits of the all-routed
// CUDA model tests (max-norm 0.06, rel-L2 0.03; CudaDecoderModel.MatchesCpuBf16AllExpertsRouted), or 3x the CPU bf16
// model's own distance from its fp32 run where that is larger (the GPU's bf16 noise is of the same kind and size as
// the CPU bf16 model's; by the triangle inequality 2x would be tight, 3x leaves room for the working copies'
// roundings, kernels/cuda/lora.h). The router (trained in full): the same rule over the routers' limits 0.1 / 0.06.
// Loss: 5e-3 relative, as the base model's, or 3x the CPU bf16 loss's distance from fp32 where larger. Logits (the
// GPU's final hidden state through the head in fp64, rounded to bf16 as the CPU bf16 model's are): 3x the CPU bf16
// logits' distance from fp32, at least one bf16 step (2^-8), as CudaSublayerLayout's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../../kernels/cuda/error_report.h"
#include "cuda_model_test_util.h"
#include "core/error.h"
#include "kernels/cuda/device_copy.h"
#include "models/causal_lm.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/cuda_lora.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"
#include "models/lora_adapter.h"
#include "models/presets.h"
#include "models/registry.h"
#include "nemotron_h_cuda_test_util.h"
#include "train/cuda/cuda_train_step.h"
#include "../../fixture_dir.h"

namespace mt {
namespace {

// Qwen3-MoE: layer 0 MoE (8 experts, all routed), layer 1 dense (mlp_only_layers).
DecoderSpec qwen_config() {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["hidden_size"] = 128;
  j["head_dim"] = 64;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["moe_intermediate_size"] = 64;
  j["intermediate_size"] = 200;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 8;
  j["num_hidden_layers"] = 2;
  j["mlp_only_layers"] = {1};
  j["output_router_logits"] = true;
  j["router_aux_loss_coef"] = 0.02;
  j["initializer_range"] = 0.05;
  return DecoderSpec::from_json(j, "lora-cuda-test");
}

std::filesystem::path gpt_oss_ckpt() {
  return test::fixture_dir("gpt_oss") / "yarn_window_aux/ckpt";
}

std::vector<std::string> every_target(const DecoderSpec& s) {
  std::vector<std::string> t;
  for (const LoraTargetDef& d : lora_targets_of(s))
    if (d.refused.empty()) t.push_back(d.name);
  return t;
}

std::shared_ptr<const LoraTable> table_for(const DecoderSpec& s, int64_t r) {
  LoraConfig c;
  c.r = r;
  c.alpha = 2.0 * r;
  c.target = every_target(s);
  return std::make_shared<const LoraTable>(lora_table_of(s, c, "test"));
}

// PEFT's init, then B drawn too (std b_std), so the adapter changes the model and every path is exercised.
LoraWeights adapter_for(std::shared_ptr<const LoraTable> t, int64_t layers, float b_std) {
  LoraWeights l = LoraWeights::init(std::move(t), layers, 17);
  std::mt19937_64 g(23);
  std::normal_distribution<float> d(0.0f, b_std);
  for (const LoraEntry& e : l.table->entries) {
    if (!e.is_b) continue;
    Tensor& b = l.slot(e);
    for (int64_t i = 0; i < b.numel(); ++i) b.data_as<float>()[i] = d(g);
  }
  return l;
}

struct CpuRun {
  ForwardResult r;
  std::vector<float> logits;  // [B·S, V], a forward of its own
  ModelWeights grads;
  LoraWeights lora_grads;
};

CpuRun cpu_run(const DecoderSpec& cfg, ModelWeights& w, const LoraWeights& adapter, const Batch& b) {
  ModelOptions o;
  o.lora = &adapter;
  DecoderModel m(cfg, w, o);
  CpuRun run;
  run.grads = lora_base_grads(cfg, *adapter.table);
  run.lora_grads = LoraWeights::zeros(adapter.table, cfg.num_layers());
  run.r = m.forward_backward(b, run.grads, run.lora_grads);
  run.logits = m.forward(b, /*want_logits=*/true).logits.to_floats();
  return run;
}

struct GpuRun {
  double ce = 0, aux = 0;
  int64_t count = 0;
  ModelWeights grads;
  LoraWeights lora_grads;
};

GpuRun gpu_run(const DecoderSpec& cfg, ModelWeights& dev_w, const CudaLora& lora, const Batch& b, Recompute rc,
               double div, bool deterministic = false) {
  CudaModelOptions o;
  o.recompute = rc;
  o.deterministic = deterministic;
  o.loss_chunk_rows = 64;
  o.lora = &lora.working();
  DecoderCudaModel model(cfg, dev_w, 0, o);
  const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
  GpuRun r;
  r.grads = cuda_lora_base_grads(cfg, *lora.masters().table, 0);
  r.lora_grads = lora.zero_grads();
  const CudaLoss l = model.forward_backward(gb, r.grads, r.lora_grads, div);
  r.ce = cuda::to_host(l.ce_sum).to_floats()[0] / div;
  r.count = cuda::to_host(l.count).data_as<int32_t>()[0];
  r.aux = l.aux.defined() ? cuda::to_host(l.aux).to_floats()[0] : 0.0;
  return r;
}

// The CUDA model with `adapter` against the CPU bf16 model with it (and its fp32 twin for the noise floor), the
// GPU's loss and gradients under each of `policies`.
void expect_matches_cpu(const DecoderSpec& cfg, ModelWeights& host_w, const LoraWeights& adapter,
                        std::initializer_list<Recompute> policies = {Recompute::none}) {
  const Batch b = test::test_batch(cfg);
  ModelWeights w32 = host_w;  // the same bf16 values as F32
  for (auto& [name, t] : w32.named_parameters()) *t = t->to(DType::F32);
  const CpuRun want = cpu_run(cfg, host_w, adapter, b);
  const CpuRun want32 = cpu_run(cfg, w32, adapter, b);
  ASSERT_GT(want.r.tokens, 0);

  ModelWeights dev_w = test::to_device_weights(host_w);
  const CudaLora lora(adapter, 0);
  {  // The logits, through the forward alone.
    CudaModelOptions o;
    o.lora = &lora.working();
    DecoderCudaModel model(cfg, dev_w, 0, o);
    const Tensor hidden = model.forward_trace(cuda_batch_upload(cfg, b, 0)).final_hidden;
    const Tensor& head = cfg.tie_word_embeddings ? host_w.embed : host_w.lm_head;
    const std::vector<float> logits =
        test::bf16_logits_from_final_hidden(hidden, head, hidden.dim(0), cfg.hidden_size, cfg.vocab_size);
    const test::ErrorStats noise = test::error_stats(want.logits, want32.logits);
    const double step = 1.0 / 256.0;
    test::expect_norm(logits, want.logits, std::max(3 * noise.max_norm, step), std::max(3 * noise.rel_l2, step),
                      "logits");
  }

  const double loss_tol = std::max(5e-3 * want.r.ce_loss, 3 * std::abs(want.r.ce_loss - want32.r.ce_loss));
  const auto wg = want.grads.named_parameters();
  const auto wg32 = want32.grads.named_parameters();
  const auto wa = want.lora_grads.named_parameters();
  const auto w32a = want32.lora_grads.named_parameters();
  for (Recompute rc : policies) {
    SCOPED_TRACE(recompute_name(rc));
    const GpuRun got = gpu_run(cfg, dev_w, lora, b, rc, static_cast<double>(want.r.tokens));
    EXPECT_EQ(got.count, want.r.tokens);
    EXPECT_NEAR(got.ce, want.r.ce_loss, loss_tol) << "CPU fp32 " << want32.r.ce_loss;
    EXPECT_NEAR(got.aux, want.r.aux_loss, 1e-2 * want.r.aux_loss);

    // The frozen base has no gradient buffers on the GPU; the router (trained in full) has one.
    // Its limit: the routers' (0.1 / 0.06), or 3x the CPU bf16 model's own distance from fp32 where larger, as the
    // adapters' (GPT-OSS's router gradient gathers the bf16 noise of every expert's output: 0.064 rel-L2 on an H100).
    const auto gg = got.grads.named_parameters();
    ASSERT_EQ(gg.size(), wg.size());
    int full = 0;
    for (size_t i = 0; i < gg.size(); ++i) {
      ASSERT_EQ(gg[i].second->defined(), wg[i].second->defined()) << gg[i].first;
      if (!gg[i].second->defined()) continue;
      ++full;
      const std::vector<float> w = wg[i].second->to_floats();
      const test::ErrorStats noise = test::error_stats(w, wg32[i].second->to_floats());
      test::expect_norm(test::floats_of(*gg[i].second), w, std::max(0.1, 3 * noise.max_norm),
                        std::max(0.06, 3 * noise.rel_l2), "router gradient " + gg[i].first);
    }
    EXPECT_GT(full, 0) << "no router gradient was compared";

    // Every adapter gradient.
    const auto ga = got.lora_grads.named_parameters();
    ASSERT_EQ(ga.size(), wa.size());
    ASSERT_GT(ga.size(), 0u);
    for (size_t i = 0; i < ga.size(); ++i) {
      ASSERT_EQ(ga[i].first, wa[i].first);
      const std::vector<float> w = wa[i].second->to_floats();
      const test::ErrorStats noise = test::error_stats(w, w32a[i].second->to_floats());
      double sum = 0;
      for (float v : w) sum += std::fabs(v);
      ASSERT_GT(sum, 0.0) << ga[i].first << ": a zero reference gradient cannot tell anything";
      test::expect_norm(test::device_floats(*ga[i].second), w, std::max(0.06, 3 * noise.max_norm),
                        std::max(0.03, 3 * noise.rel_l2), "adapter gradient " + ga[i].first);
    }
  }
}

// Every target of Nemotron-H adapted, the Mamba2 in_proj among them (out_proj is refused, as PEFT refuses it; r 8: the
// expert stacks' grouped GEMMs need a multiple of 8). B std 0.05 makes each adapter's output a fair part of its
// projection's: u = n·Aᵀ is ~0.6 (A U(±1/√64), 64 unit inputs), s·u·Bᵀ ~2·0.6·0.05·√8 ≈ 0.17 against the base's
// ~0.08·√64 = 0.64.
std::shared_ptr<const LoraTable> nemotron_table(const DecoderSpec& cfg) {
  std::shared_ptr<const LoraTable> t = table_for(cfg, 8);
  int mamba = 0;
  for (const LoraEntry& e : t->entries)
    mamba += e.slot == WeightSlot::mamba_in_proj;
  EXPECT_EQ(mamba, 2 * 2) << "in_proj (A and B) of the two Mamba2 layers";
  return t;
}
constexpr float kNemotronBStd = 0.05f;

TEST(CudaLoraModel, QwenMoeWithDenseLayerMatchesCpuBf16) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = qwen_config();
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 7);
  const LoraWeights adapter = adapter_for(table_for(cfg, 16), cfg.num_layers(), 0.02f);
  expect_matches_cpu(cfg, host_w, adapter);
}

TEST(CudaLoraModel, GptOssMatchesCpuBf16) {
  MT_SKIP_WITHOUT_CUDA();
  CausalLM m = CausalLM::from_pretrained(gpt_oss_ckpt().string(), {DType::BF16});
  DecoderSpec cfg = m.config;
  for (MoeSpec& moe : cfg.moe) moe.experts_per_token = moe.num_experts;
  const LoraWeights adapter = adapter_for(table_for(cfg, 8), cfg.num_layers(), 0.1f);
  expect_matches_cpu(cfg, m.weights, adapter);
}

TEST(CudaLoraModel, NemotronHMatchesCpuBf16UnderEveryRecomputePolicy) {
  MT_SKIP_WITHOUT_CUDA();
  DecoderSpec cfg = test::nemotron_test_spec();
  for (MoeSpec& moe : cfg.moe) moe.experts_per_token = moe.num_experts;  // no routing flip (the header's limits)
  ASSERT_EQ(cuda_model_unsupported_reason(cfg), "");
  ModelWeights host_w = test::nemotron_random_weights(cfg, 7);
  const LoraWeights adapter = adapter_for(nemotron_table(cfg), cfg.num_layers(), kNemotronBStd);
  expect_matches_cpu(cfg, host_w, adapter, {Recompute::none, Recompute::selective, Recompute::full});
}

// PEFT's init (B = 0): every adapter adds exactly zero (kernels/cuda/lora.h: bf16(y + 0) = y), so the loss and the
// final hidden state equal the base model's bit for bit, through the forward and the training forward alike.
void expect_zero_b_gives_the_base_model_bitwise(const DecoderSpec& cfg, ModelWeights& host_w,
                                                std::shared_ptr<const LoraTable> table) {
  ModelWeights dev_w = test::to_device_weights(host_w);
  const LoraWeights adapter = LoraWeights::init(std::move(table), cfg.num_layers(), 5);
  const CudaLora lora(adapter, 0);
  const Batch b = test::test_batch(cfg);
  const CudaBatch gb = cuda_batch_upload(cfg, b, 0);

  DecoderCudaModel base(cfg, dev_w, 0);
  CudaModelOptions o;
  o.lora = &lora.working();
  DecoderCudaModel adapted(cfg, dev_w, 0, o);
  const std::vector<float> h_base = test::device_floats(base.forward_trace(gb).final_hidden);
  const std::vector<float> h_adapted = test::device_floats(adapted.forward_trace(gb).final_hidden);
  ASSERT_EQ(h_base.size(), h_adapted.size());
  for (size_t i = 0; i < h_base.size(); ++i) ASSERT_EQ(h_base[i], h_adapted[i]) << "final hidden at " << i;

  ModelWeights base_g = test::device_zeros_like(cfg);
  const double ce_base = cuda::to_host(base.forward_backward(gb, base_g, 100.0).ce_sum).to_floats()[0];
  ModelWeights frozen_g = cuda_lora_base_grads(cfg, *lora.masters().table, 0);
  LoraWeights lora_g = lora.zero_grads();
  const double ce_adapted = cuda::to_host(adapted.forward_backward(gb, frozen_g, lora_g, 100.0).ce_sum).to_floats()[0];
  EXPECT_EQ(ce_adapted, ce_base);
  // With B = 0 only the B gradients are non-zero (dA = duᵀ·x with du = dy·B = 0).
  for (const LoraEntry& e : lora_g.table->entries) {
    const std::vector<float> g = test::device_floats(lora_g.slot(e));
    double sum = 0;
    for (float v : g) sum += std::fabs(v);
    if (e.is_b)
      EXPECT_GT(sum, 0.0) << e.name;
    else
      EXPECT_EQ(sum, 0.0) << e.name;
  }
}

TEST(CudaLoraModel, ZeroBGivesTheBaseModelBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = qwen_config();
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 9);
  expect_zero_b_gives_the_base_model_bitwise(cfg, host_w, table_for(cfg, 16));
}

TEST(CudaLoraModel, NemotronHZeroBGivesTheBaseModelBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = test::nemotron_test_spec();
  ModelWeights host_w = test::nemotron_random_weights(cfg, 9);
  expect_zero_b_gives_the_base_model_bitwise(cfg, host_w, nemotron_table(cfg));
}

// Recompute none | selective | full with an adapter: the same loss bits, gradients within the flash backward's
// reordering (as CudaDecoderModel.RecomputePoliciesAgree).
TEST(CudaLoraModel, RecomputePoliciesAgree) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = qwen_config();
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 11);
  ModelWeights dev_w = test::to_device_weights(host_w);
  const CudaLora lora(adapter_for(table_for(cfg, 16), cfg.num_layers(), 0.02f), 0);
  const Batch b = test::test_batch(cfg);
  const GpuRun none = gpu_run(cfg, dev_w, lora, b, Recompute::none, 100.0);
  for (Recompute rc : {Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(rc));
    const GpuRun r = gpu_run(cfg, dev_w, lora, b, rc, 100.0);
    EXPECT_EQ(r.ce, none.ce);
    const auto a = r.lora_grads.named_parameters();
    const auto n = none.lora_grads.named_parameters();
    for (size_t i = 0; i < a.size(); ++i)
      test::expect_norm(test::device_floats(*a[i].second), test::device_floats(*n[i].second), 2e-3, 1e-3, a[i].first);
  }
}

// Nemotron-H with train.deterministic (flash's backward without atomics; every other kernel, the Mamba2 ones included,
// sums in a fixed order): selective keeps the adapters' u and recomputes n and g bit for bit from the kept x, proj and
// y; full reruns the layer, adapters included. So the loss and every adapter and router gradient are the same bits
// under each policy.
TEST(CudaLoraModel, NemotronHRecomputePoliciesAgreeBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = test::nemotron_test_spec();
  ModelWeights host_w = test::nemotron_random_weights(cfg, 11);
  ModelWeights dev_w = test::to_device_weights(host_w);
  const CudaLora lora(adapter_for(nemotron_table(cfg), cfg.num_layers(), kNemotronBStd), 0);
  const Batch b = test::test_batch(cfg);
  const GpuRun none = gpu_run(cfg, dev_w, lora, b, Recompute::none, 100.0, /*deterministic=*/true);
  for (Recompute rc : {Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(rc));
    const GpuRun r = gpu_run(cfg, dev_w, lora, b, rc, 100.0, /*deterministic=*/true);
    EXPECT_EQ(r.ce, none.ce);
    const auto a = r.lora_grads.named_parameters(), n = none.lora_grads.named_parameters();
    ASSERT_EQ(a.size(), n.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(test::same_bits(test::device_floats(*a[i].second), test::device_floats(*n[i].second)))
          << "adapter gradient " << a[i].first << " differs";
    const auto g = r.grads.named_parameters(), w = none.grads.named_parameters();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i) {
      if (!g[i].second->defined()) continue;  // frozen
      EXPECT_TRUE(test::same_bits(test::device_floats(*g[i].second), test::device_floats(*w[i].second)))
          << "gradient " << g[i].first << " differs";
    }
  }
}

// r % 8 != 0 on an expert stack is refused when the model is made, with one line naming peft.r.
TEST(CudaLoraModel, RefusesExpertRankNotMultipleOfEight) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = qwen_config();
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 3);
  ModelWeights dev_w = test::to_device_weights(host_w);
  const CudaLora lora(LoraWeights::init(table_for(cfg, 4), cfg.num_layers(), 1), 0);
  CudaModelOptions o;
  o.lora = &lora.working();
  try {
    DecoderCudaModel m(cfg, dev_w, 0, o);
    FAIL() << "r = 4 on experts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("peft.r"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt
