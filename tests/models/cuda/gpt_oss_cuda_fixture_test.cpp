// The CUDA model on GPT-OSS against what Transformers 5.17 computed for the tiny fixture checkpoints
// (tests/fixtures/gpt_oss, tools/hf_reference/make_family_fixtures.py: eager attention, grouped_mm experts), and
// against the CPU model. yarn_window_aux: YaRN RoPE, a 4-token window on layer 0, GQA 4/2 of head_dim 16, 4
// experts top-2, aux loss coef 0.02; tied_mqa_default_rope: default RoPE, MQA 4/1 of head_dim 32, a 6-token window,
// tied embeddings, top-3 of 4. Both have q/k/v/o biases, sinks, router and expert biases and the clamped SwiGLU;
// the plain batch is 2 x 16 with ignored labels. Checkpoints load in bf16 as Transformers' bf16 rows did.
//
// Thresholds (the derivations of tests/models/cuda/qwen3_moe_cuda_fixture_test.cpp, which this follows):
// - CE and total loss vs Transformers' bf16: 5e-3 relative, ~4x Transformers' own fp32-to-bf16 move on these batches
//   (meta.json: 4.0e-3 for yarn_window_aux). Transformers runs GPT-OSS's attention eagerly in bf16 (scores and
//   softmax rounded to bf16, the CPU model's eager_bf16); flash attention keeps them in fp32 and rounds P once, a
//   difference of the same size as the other rounding-order differences.
// - aux loss: 1e-2 relative (the bf16 means of the probabilities, 2^-7, and one near-tie routed differently by the
//   two bf16 runs: E·|P_a − P_b| / rows).
// - logits: within 3x Transformers' own bf16-vs-fp32 distance (rel-L2 and max-norm; floor one bf16 step), by the
//   triangle inequality, unless a near-tie routes a token differently (printed with MT_PRINT_ERRORS).
// - gradients vs the CPU model's bf16 gradients on the same weights: max-norm 0.06 / rel-L2 0.03 (router 0.1 /
//   0.06), each raised to 3x the CPU bf16 gradient's own distance from the CPU fp32 one where that is larger, with
//   top-k = E on both sides so no near-tie can route differently (the real routing is checked by the losses above).
// - one AdamW step vs Transformers' step: test::expect_one_cuda_adamw_step_matches (cuda_model_test_util.h).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../hf_fixture_util.h"
#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_model_test_util.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"
#include "../../fixture_dir.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

const char* kVariants[] = {"yarn_window_aux", "tied_mqa_default_rope"};

fs::path fixtures_dir() { return test::fixture_dir("gpt_oss"); }

double rel_diff(double got, double want) { return std::fabs(got - want) / std::fabs(want); }

class CudaGptOssFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_SKIP_WITHOUT_CUDA();
    dir_ = fixtures_dir();
    ASSERT_FALSE(dir_.empty()) << "tests/fixtures/gpt_oss not found";
  }
  fs::path dir_;
};

TEST_F(CudaGptOssFixture, LossAndLogitsMatchTransformersBf16) {
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const fs::path vdir = dir_ / variant;
    const auto meta = test::read_json(vdir / "meta.json");
    CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
    ASSERT_EQ(cuda_model_unsupported_reason(m.config), "");
    ModelWeights dev_w = test::to_device_weights(m.weights);
    DecoderCudaModel model(m.config, dev_w, 0);
    SafetensorsFile io = SafetensorsFile::open((vdir / "plain.safetensors").string());
    const auto& ref = meta["batches"]["plain"]["bf16"];
    const CudaBatch gb = cuda_batch_upload(m.config, test::load_batch(io), 0);
    const CudaLoss l = model.forward(gb);
    const int64_t count = cuda::to_host(l.count).data_as<int32_t>()[0];
    ASSERT_EQ(count, ref["tokens"].get<int64_t>());
    const double ce = cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(count);
    EXPECT_LE(rel_diff(ce, ref["ce_loss"].get<double>()), 5e-3) << "ce " << ce << " vs " << ref["ce_loss"];
    double loss = ce;
    if (model.aux_enabled()) {
      const double aux = cuda::to_host(l.aux).to_floats()[0];
      EXPECT_LE(rel_diff(aux, ref["aux_loss"].get<double>()), 1e-2) << "aux " << aux << " vs " << ref["aux_loss"];
      loss += m.config.aux_loss_coef() * aux;
    }
    EXPECT_LE(rel_diff(loss, ref["loss"].get<double>()), 5e-3) << "loss " << loss << " vs " << ref["loss"];

    const DecoderCudaModel::Trace t = model.forward_trace(gb);
    const Tensor& head = m.config.tie_word_embeddings ? m.weights.embed : m.weights.lm_head;
    const std::vector<float> logits = test::bf16_logits_from_final_hidden(
        t.final_hidden, head, gb.tokens(), m.config.hidden_size, m.config.vocab_size);
    const std::vector<float> hf16 =
        SafetensorsFile::open((vdir / "plain_bf16_logits.safetensors").string()).tensor("logits").to_floats();
    const std::vector<float> hf32 = io.tensor("logits").to_floats();
    ASSERT_EQ(logits.size(), hf16.size());
    const test::ErrorStats n = test::error_stats(hf16, hf32), e = test::error_stats(logits, hf16);
    const double floor = 1.0 / 256.0;
    if (std::getenv("MT_PRINT_ERRORS"))
      std::printf("[ error    ] %s: ce %.7g (transformers %.7g, rel %.2e); logits rel-L2 %.3g max-norm %.3g "
                  "(transformers bf16 vs fp32 %.3g, %.3g)\n",
                  variant, ce, ref["ce_loss"].get<double>(), rel_diff(ce, ref["ce_loss"].get<double>()), e.rel_l2,
                  e.max_norm, n.rel_l2, n.max_norm);
    EXPECT_LE(e.rel_l2, std::max(3 * n.rel_l2, floor)) << "logits rel-L2 (transformers bf16 vs fp32: " << n.rel_l2 << ")";
    EXPECT_LE(e.max_norm, std::max(3 * n.max_norm, floor))
        << "logits max-norm (transformers bf16 vs fp32: " << n.max_norm << ")";
  }
}

TEST_F(CudaGptOssFixture, GradientsMatchCpuBf16) {
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const fs::path vdir = dir_ / variant;
    CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
    DecoderSpec cfg = m.config;
    for (MoeSpec& moe : cfg.moe) moe.experts_per_token = moe.num_experts;
    ModelWeights w32 = m.weights;  // the same bf16 values as F32: the CPU model in fp32
    for (auto& [name, t] : w32.named_parameters()) *t = t->to(DType::F32);
    ModelWeights dev_w = test::to_device_weights(m.weights);
    SafetensorsFile io = SafetensorsFile::open((vdir / "plain.safetensors").string());
    const Batch b = test::load_batch(io);
    ModelWeights cpu_g = ModelWeights::zeros_like_config(cfg, DType::F32);
    const ForwardResult want = DecoderModel(cfg, m.weights).forward_backward(b, cpu_g);
    ModelWeights cpu32_g = ModelWeights::zeros_like_config(cfg, DType::F32);
    DecoderModel(cfg, w32).forward_backward(b, cpu32_g);

    DecoderCudaModel model(cfg, dev_w, 0);
    const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
    ASSERT_EQ(gb.target_count, want.tokens);
    ModelWeights got_g = test::device_zeros_like(cfg);
    const CudaLoss l = model.forward_backward(gb, got_g, static_cast<double>(gb.target_count));
    EXPECT_LE(rel_diff(cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(want.tokens), want.ce_loss), 5e-3);

    auto want_p = cpu_g.named_parameters();
    auto fp32_p = cpu32_g.named_parameters();
    bool saw_sinks = false, saw_expert_bias = false;
    for (const auto& [name, t] : want_p) {
      saw_sinks |= name.find("self_attn.sinks") != std::string::npos;
      saw_expert_bias |= name.find("experts.gate_up_proj_bias") != std::string::npos;
    }
    EXPECT_TRUE(saw_sinks && saw_expert_bias);  // the GPT-OSS parameters are compared too
    test::expect_gradients_near(
        got_g, cpu_g,
        [&](size_t i, const std::string& name) {
          const test::ErrorStats noise =
              test::error_stats(want_p[i].second->to_floats(), fp32_p[i].second->to_floats());
          const test::GradLimit lim = test::router_limit(name, {0.06, 0.03});
          return test::GradLimit{std::max(lim.max_norm, 3 * noise.max_norm), std::max(lim.rel_l2, 3 * noise.rel_l2)};
        },
        "gradient");
  }
}

TEST_F(CudaGptOssFixture, OneAdamWStepMatchesTransformers) {
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    test::expect_one_cuda_adamw_step_matches(dir_ / variant);
  }
}

}  // namespace
}  // namespace mt
