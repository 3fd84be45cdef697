// The CUDA model on DeepSeek-V3 against what Transformers 5.17 computed for the tiny fixture checkpoints
// (tests/fixtures/deepseek_v3, tests/fixtures/README.md: sdpa attention, grouped_mm experts), and against the CPU
// model. mla_yarn_dense1: MLA with a q LoRA rank, qk 24 + 8 / v 16 (flash attention runs it with the value zero-padded
// to 32), interleaved YaRN (factor 40), layer 0 dense, layer 1 8 experts in 4 groups (keep 2), top-2, × 2.5, a shared
// expert; batches plain, packed and packed2 (documents). plain_q_legacy_config: a plain q_proj, every layer MoE, one
// group, top-3 without renormalisation, × 1.5, two shared experts, YaRN factor 4 with mscale ≠ mscale_all_dim.
// Checkpoints load in bf16 as Transformers' bf16 rows did; the fp32 e_score_correction_bias stays fp32.
//
// Thresholds (the derivations of tests/models/cuda/gpt_oss_cuda_fixture_test.cpp, which this follows):
// - CE loss vs the CPU model in bf16 (the same rounding points): 5e-3 relative on every batch. vs Transformers' bf16:
//   that 5e-3 plus the CPU model's own bf16-to-fp32 move plus Transformers' own fp32-to-bf16 move on the batch
//   (meta.json: 5.7e-4 on plain, 1.2e-3 on packed, 6.5e-3 on packed2): the triangle through the fp32 loss, which
//   both fp32 models match to 1e-5; the packed batches hold near-tied group-limited routing decisions, which bf16 noise
//   flips differently on each side (measured: CPU bf16 5.6596 vs fp32 5.5842 on packed, 6.8494 vs 6.9054 on packed2;
//   the GPU 5.676 on packed). Transformers' sdpa on the
//   CPU runs torch's flash attention, which rounds exp(s − max) to bf16 before P·V and normalises after, as the CUDA
//   kernels do.
// - logits: within 3x Transformers' own bf16-vs-fp32 distance (rel-L2 and max-norm; floor one bf16 step), by the
//   triangle inequality, unless a near-tie routes a token differently (meta.json router_min_gap: the fixtures' seeds
//   were picked so the sigmoid scores' top-k gaps are far above bf16 noise).
// - gradients vs the CPU model's bf16 gradients on the same weights: max-norm 0.06 / rel-L2 0.03 (router 0.1 / 0.06),
//   each raised to 3x the CPU bf16 gradient's own distance from the CPU fp32 one where that is larger, with every
//   expert routed on both sides (one group, top-k = E) so no near-tie can route differently.
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

#include "../../fixture_dir.h"
#include "../../kernels/cuda/cuda_test_util.h"
#include "../hf_fixture_util.h"
#include "core/error.h"
#include "cuda_model_test_util.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* variant;
  const char* batch;
};
const Case kCases[] = {{"mla_yarn_dense1", "plain"},
                       {"mla_yarn_dense1", "packed"},
                       {"mla_yarn_dense1", "packed2"},
                       {"plain_q_legacy_config", "plain"}};
const char* kVariants[] = {"mla_yarn_dense1", "plain_q_legacy_config"};

double rel_diff(double got, double want) { return std::fabs(got - want) / std::fabs(want); }

class CudaDeepseekV3Fixture : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_SKIP_WITHOUT_CUDA();
    dir_ = test::fixture_dir("deepseek_v3");
    ASSERT_FALSE(dir_.empty()) << "tests/fixtures/deepseek_v3 not found";
  }
  fs::path dir_;
};

TEST_F(CudaDeepseekV3Fixture, LossAndLogitsMatchTransformersBf16) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.variant) + " " + c.batch);
    const fs::path vdir = dir_ / c.variant;
    const auto meta = test::read_json(vdir / "meta.json");
    CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
    ASSERT_EQ(cuda_model_unsupported_reason(m.config), "");
    ASSERT_EQ(m.weights.layers.back().router_score_bias.dtype(), DType::F32);
    ModelWeights dev_w = test::to_device_weights(m.weights);
    DecoderCudaModel model(m.config, dev_w, 0);
    SafetensorsFile io = SafetensorsFile::open((vdir / (std::string(c.batch) + ".safetensors")).string());
    const auto& ref = meta["batches"][c.batch]["bf16"];
    const CudaBatch gb = cuda_batch_upload(m.config, test::load_batch(io), 0);
    const CudaLoss l = model.forward(gb);
    EXPECT_FALSE(model.aux_enabled());
    const int64_t count = cuda::to_host(l.count).data_as<int32_t>()[0];
    ASSERT_EQ(count, ref["tokens"].get<int64_t>());
    const double ce = cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(count);
    const Batch hb = test::load_batch(io);
    const double cpu16 = DecoderModel(m.config, m.weights).forward(hb, false).ce_loss;
    EXPECT_LE(rel_diff(ce, cpu16), 5e-3) << "ce " << ce << " vs the CPU model in bf16 " << cpu16;
    // From Transformers' bf16 loss: the triangle GPU → CPU bf16 (5e-3) → fp32 (the CPU's bf16 move) → Transformers'
    // bf16 (its own move).
    const double fp32 = meta["batches"][c.batch]["fp32"]["ce_loss"].get<double>();
    const double bound = 5e-3 + rel_diff(ref["ce_loss"].get<double>(), fp32) + rel_diff(cpu16, fp32);
    EXPECT_LE(rel_diff(ce, ref["ce_loss"].get<double>()), bound) << "ce " << ce << " vs " << ref["ce_loss"];
    EXPECT_LE(rel_diff(ce, ref["loss"].get<double>()), bound) << "loss " << ce << " vs " << ref["loss"];
    if (std::string(c.batch) != "plain") continue;  // bf16 logits are stored for the plain batch

    const DecoderCudaModel::Trace t = model.forward_trace(gb);
    const std::vector<float> logits = test::bf16_logits_from_final_hidden(
        t.final_hidden, m.weights.lm_head, gb.tokens(), m.config.hidden_size, m.config.vocab_size);
    const std::vector<float> hf16 =
        SafetensorsFile::open((vdir / "plain_bf16_logits.safetensors").string()).tensor("logits").to_floats();
    const std::vector<float> hf32 = io.tensor("logits").to_floats();
    ASSERT_EQ(logits.size(), hf16.size());
    const test::ErrorStats n = test::error_stats(hf16, hf32), e = test::error_stats(logits, hf16);
    const double floor = 1.0 / 256.0;
    if (std::getenv("MT_PRINT_ERRORS"))
      std::printf("[ error    ] %s: ce %.7g (transformers %.7g, rel %.2e); logits rel-L2 %.3g max-norm %.3g "
                  "(transformers bf16 vs fp32 %.3g, %.3g)\n",
                  c.variant, ce, ref["ce_loss"].get<double>(), rel_diff(ce, ref["ce_loss"].get<double>()), e.rel_l2,
                  e.max_norm, n.rel_l2, n.max_norm);
    EXPECT_LE(e.rel_l2, std::max(3 * n.rel_l2, floor)) << "logits rel-L2 (transformers bf16 vs fp32: " << n.rel_l2 << ")";
    EXPECT_LE(e.max_norm, std::max(3 * n.max_norm, floor))
        << "logits max-norm (transformers bf16 vs fp32: " << n.max_norm << ")";
  }
}

TEST_F(CudaDeepseekV3Fixture, GradientsMatchCpuBf16) {
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    const fs::path vdir = dir_ / variant;
    CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
    DecoderSpec cfg = m.config;
    for (MoeSpec& moe : cfg.moe) {  // every expert routed
      moe.router.groups = moe.router.topk_groups = 1;
      moe.experts_per_token = moe.num_experts;
    }
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
    bool saw_mla = false, saw_shared = false;
    for (const auto& [name, t] : want_p) {
      saw_mla |= name.find("kv_a_proj_with_mqa") != std::string::npos;
      saw_shared |= name.find("shared_experts") != std::string::npos;
    }
    EXPECT_TRUE(saw_mla && saw_shared);  // the DeepSeek-V3 parameters are compared too
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

// Each document of the packed batch (one row, documents of 7 and 9 tokens) scored inside the row (the other
// document's labels ignored) and alone as its own row: Transformers honours the documents (meta.json
// hf.packed_vs_separate_max_abs ~4e-6), so the two must agree up to bf16 noise from the other GEMM shapes. With every
// expert routed no near-tie can flip a decision: 2e-3 relative (the plain batch's CUDA-vs-Transformers distance is
// 3e-4). With the fixture's own router (top-2 of 4 groups, router_min_gap 2.9e-3, below bf16 noise) the numbers are
// printed under MT_PRINT_ERRORS, with the CPU bf16 model's, to tell a flip from a packing fault.
TEST_F(CudaDeepseekV3Fixture, PackedDocumentsEqualSeparateRows) {
  const fs::path vdir = dir_ / "mla_yarn_dense1";
  CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
  const Batch packed = test::load_batch(SafetensorsFile::open((vdir / "packed.safetensors").string()));
  ASSERT_EQ(packed.input_ids.dim(0), 1);
  const int64_t S = packed.input_ids.dim(1);
  const int64_t* pos = packed.position_ids.data_as<int64_t>();
  std::vector<int64_t> starts;
  for (int64_t t = 0; t < S; ++t)
    if (t == 0 || pos[t] != pos[t - 1] + 1) starts.push_back(t);
  ASSERT_EQ(starts.size(), 2u);
  starts.push_back(S);
  ModelWeights dev_w = test::to_device_weights(m.weights);
  for (const bool all_routed : {true, false}) {
    DecoderSpec cfg = m.config;
    if (all_routed)
      for (MoeSpec& moe : cfg.moe) moe.router.groups = moe.router.topk_groups = 1, moe.experts_per_token = moe.num_experts;
    DecoderCudaModel model(cfg, dev_w, 0);
    DecoderModel cpu(cfg, m.weights);
    for (size_t d = 0; d + 1 < starts.size(); ++d) {
      SCOPED_TRACE((all_routed ? "all routed, document " : "fixture router, document ") + std::to_string(d));
      const int64_t a = starts[d], n = starts[d + 1] - a;
      Batch inside = packed;
      inside.labels = packed.labels.clone();
      for (int64_t t = 0; t < S; ++t)
        if (t < a || t >= a + n) inside.labels.data_as<int64_t>()[t] = -100;
      Batch alone;
      alone.input_ids = Tensor::empty({1, n}, DType::I64);
      alone.labels = Tensor::empty({1, n}, DType::I64);
      for (int64_t t = 0; t < n; ++t) {
        alone.input_ids.data_as<int64_t>()[t] = packed.input_ids.data_as<int64_t>()[a + t];
        alone.labels.data_as<int64_t>()[t] = packed.labels.data_as<int64_t>()[a + t];
      }
      auto gpu_ce = [&](const Batch& b) {
        const CudaLoss l = model.forward(cuda_batch_upload(cfg, b, 0));
        return cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(cuda::to_host(l.count).data_as<int32_t>()[0]);
      };
      const double g_in = gpu_ce(inside), g_alone = gpu_ce(alone);
      const double c_in = cpu.forward(inside, false).ce_loss, c_alone = cpu.forward(alone, false).ce_loss;
      if (std::getenv("MT_PRINT_ERRORS"))
        std::printf("[ packed   ] %s doc %zu (%lld tokens): cuda in row %.6f alone %.6f | cpu bf16 in row %.6f alone %.6f\n",
                    all_routed ? "all routed" : "fixture router", d, static_cast<long long>(n), g_in, g_alone, c_in,
                    c_alone);
      if (all_routed) {
        EXPECT_LE(rel_diff(g_in, g_alone), 2e-3) << "cuda in row " << g_in << " alone " << g_alone;
        EXPECT_LE(rel_diff(g_in, c_in), 5e-3) << "cuda " << g_in << " cpu bf16 " << c_in;
      }
    }
  }
}

TEST_F(CudaDeepseekV3Fixture, OneAdamWStepMatchesTransformers) {
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    test::expect_one_cuda_adamw_step_matches(dir_ / variant);
  }
}

}  // namespace
}  // namespace mt
