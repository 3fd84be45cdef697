// The CUDA model end to end against what Transformers 5.17 computed for the tiny fixture checkpoints
// (tests/fixtures/qwen3_moe, tools/hf_reference/make_model_fixtures.py). The checkpoint is loaded in bf16
// as Transformers' bf16 rows were (from_pretrained(dtype=torch.bfloat16): the fp32 weights rounded to
// bf16), and each fixture batch (plain: 2 x 10 with ignored labels; packed: 1 x 14, two documents;
// packed2: 2 x 12, five documents) runs through cuda_batch_upload with the document mask (the fixtures
// were made with use_cache=False, so Transformers masked packed documents: ModelOptions in
// models/decoder_model.h).
//
// Which fixtures: moe_mqa_legacy: MQA 4/1, head_dim 16 (flash attention's 2-chunk tiles), 4 experts with
// top-4, tied embeddings, aux loss coef 0.001, legacy config spellings. dense_qwen3 (Qwen3ForCausalLM, every
// layer the dense MLP block) and moe_gqa_aux (mlp_only_layers [1]: layers 0 and 2 MoE with top-2 of 8, layer 1
// dense; aux loss coef 0.02) run too (the Dense* tests below). moe_mha_tied_sparse2 (decoder_sparse_step 2)
// has head_dim 8, which flash attention has no kernel for: refused (checked below); its dense layers are
// covered by CudaDecoderModel.DenseLayersMatchCpuBf16 (decoder_sparse_step 2 on a random model).
//
// Thresholds:
// - CE loss vs Transformers' bf16 CE (meta.json): 5e-3 relative. Going from fp32 to bf16 moves
//   Transformers' own CE on these batches by 0.4e-3 to 1.3e-3 relative: that is the size of the
//   model's bf16 rounding noise, and two bf16 implementations that round at the same points but
//   accumulate in different orders differ by less (the CPU bf16 model: 1.2e-4 to 4.3e-4); 5e-3 leaves
//   ~4x over the fp32-to-bf16 move. Attending across packed documents instead moves the CE by 2.7e-2
//   (packed) and 1.05e-2 (packed2) on the CPU model, so a document-mask error fails.
// - aux loss vs Transformers' bf16 aux: 8e-3 relative, a bound, not a measurement. With top-k = E
//   every expert takes every token (f_e = 1), so aux = E · Σ_e P_e, where each P_e is a bf16-rounded
//   mean of bf16-rounded probabilities: on each side Σ_e P_e = 1 ± 2^-8 (one rounding of the
//   probabilities, one of the means, relative 2^-9 each), so two such implementations differ by at
//   most 2^-7 relative ≈ 7.8e-3 (the CPU bf16 model: up to 2.0e-3). This catches a missing or doubled
//   aux, a wrong E or layer count, not a subtle aux error (this fixture's aux is 4 up to rounding:
//   meta.json has 3.9999 to 4.0012).
// - total loss = CE + 0.001 · aux vs Transformers' bf16 loss: 5e-3 relative (as CE).
// - gradients vs the CPU model's bf16 gradients (DecoderModel on the same bf16 weights, Transformers'
//   bf16 rounding points; in fp32 the CPU model matches Transformers' gradients to 1e-4 in HfParity):
//   max-norm 0.06, rel-L2 0.03 per parameter, as CudaDecoderModel.MatchesCpuBf16AllExpertsRouted (router
//   weights: 0.1 / 0.06, see the loop)
//   (top-k = E there too, so no routing decision can flip; what differs is other accumulation orders,
//   flash attention's bf16 rounding of the unnormalised P and its bf16 dS, and the fp32 atomics of its
//   backward). For scale: the CPU bf16 gradients are 0.6e-2 to 4.6e-2 (rel-L2) from Transformers' fp32
//   gradients on these batches, which is every bf16 rounding point against none; MT_PRINT_ERRORS=1
//   prints the CUDA gradients' distance to both.
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
#include "../../kernels/cuda/error_report.h"
#include "../hf_fixture_util.h"
#include "cuda_model_test_util.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "models/causal_lm.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"
#include "train/adamw.h"
#include "../../fixture_dir.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

const char* kBatches[] = {"plain", "packed", "packed2"};

fs::path fixtures_dir() { return test::fixture_dir("qwen3_moe"); }

using test::device_zeros_like;
using test::load_batch;
using test::read_json;
using test::router_limit;
using test::to_device_weights;

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  return test::error_stats(a, ref).rel_l2;
}

double rel_diff(double got, double want) { return std::fabs(got - want) / std::fabs(want); }

class CudaHfFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_SKIP_WITHOUT_CUDA();
    dir_ = fixtures_dir();
    ASSERT_FALSE(dir_.empty()) << "tests/fixtures/qwen3_moe not found under $MIXTUNE_SOURCE_DIR, " << MIXTUNE_SOURCE_DIR
                               << " or the working directory";
  }
  fs::path dir_;
};

// Loss and aux loss through forward() and forward_backward(), against Transformers' bf16 numbers.
TEST_F(CudaHfFixture, MqaLegacyLossMatchesTransformersBf16) {
  const fs::path vdir = dir_ / "moe_mqa_legacy";
  const auto meta = read_json(vdir / "meta.json");
  CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
  ASSERT_EQ(m.config.only_attention().head_dim, 16);
  ASSERT_EQ(m.config.experts_per_token(), m.config.num_experts());  // the aux bound above needs top-k = E
  ModelWeights dev_w = to_device_weights(m.weights);
  DecoderCudaModel model(m.config, dev_w, 0);
  ASSERT_TRUE(model.aux_enabled());
  const double coef = m.config.aux_loss_coef();
  for (const char* bname : kBatches) {
    SCOPED_TRACE(bname);
    SafetensorsFile io = SafetensorsFile::open((vdir / (std::string(bname) + ".safetensors")).string());
    const auto& ref = meta["batches"][bname]["bf16"];
    const CudaBatch gb = cuda_batch_upload(m.config, load_batch(io), 0);
    ASSERT_EQ(gb.target_count, ref["tokens"].get<int64_t>());

    const CudaLoss l = model.forward(gb);
    const int64_t count = cuda::to_host(l.count).data_as<int32_t>()[0];
    ASSERT_EQ(count, ref["tokens"].get<int64_t>());
    const double ce = cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(count);
    ASSERT_TRUE(l.aux.defined());
    const double aux = cuda::to_host(l.aux).to_floats()[0];
    EXPECT_LE(rel_diff(ce, ref["ce_loss"].get<double>()), 5e-3) << "ce " << ce << " vs " << ref["ce_loss"];
    EXPECT_LE(rel_diff(aux, ref["aux_loss"].get<double>()), 8e-3) << "aux " << aux << " vs " << ref["aux_loss"];
    EXPECT_LE(rel_diff(ce + coef * aux, ref["loss"].get<double>()), 5e-3);
    if (std::getenv("MT_PRINT_ERRORS"))
      std::printf("[ error    ] %s: ce %.7g (transformers %.7g, rel %.2e), aux %.7g (%.7g, rel %.2e)\n", bname, ce,
                  ref["ce_loss"].get<double>(), rel_diff(ce, ref["ce_loss"].get<double>()), aux,
                  ref["aux_loss"].get<double>(), rel_diff(aux, ref["aux_loss"].get<double>()));

    // forward_backward reports the same losses (the forward is deterministic; the head runs on the
    // target rows only, so within fp32 rounding rather than bitwise).
    ModelWeights grads = device_zeros_like(m.config);
    const CudaLoss lb = model.forward_backward(gb, grads, static_cast<double>(gb.target_count));
    EXPECT_NEAR(cuda::to_host(lb.ce_sum).to_floats()[0] / static_cast<double>(count), ce, 1e-5 * ce);
    EXPECT_NEAR(cuda::to_host(lb.aux).to_floats()[0], aux, 1e-6 * aux);
  }
}

// Every parameter gradient against the CPU model's bf16 gradients on the same weights and batch.
TEST_F(CudaHfFixture, MqaLegacyGradientsMatchCpuBf16) {
  const fs::path vdir = dir_ / "moe_mqa_legacy";
  CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
  ModelWeights dev_w = to_device_weights(m.weights);
  for (const char* bname : kBatches) {
    SCOPED_TRACE(bname);
    SafetensorsFile io = SafetensorsFile::open((vdir / (std::string(bname) + ".safetensors")).string());
    const Batch b = load_batch(io);

    ModelWeights cpu_g = ModelWeights::zeros_like_config(m.config, DType::F32);
    const ForwardResult want = DecoderModel(m.config, m.weights).forward_backward(b, cpu_g);

    DecoderCudaModel model(m.config, dev_w, 0);
    const CudaBatch gb = cuda_batch_upload(m.config, b, 0);
    ASSERT_EQ(gb.target_count, want.tokens);
    ModelWeights got_g = device_zeros_like(m.config);
    const CudaLoss l = model.forward_backward(gb, got_g, static_cast<double>(gb.target_count));
    // The two bf16 models' losses: the same rounding points, other accumulation orders (see the header).
    EXPECT_LE(rel_diff(cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(want.tokens), want.ce_loss),
              5e-3);

    // The router's gradient goes through the routing-weight dot products over H and the softmax Jacobian of bf16
    // logits: the noisiest (measured on the H200: 3.07e-2 rel-L2 for layer 1's, the rest <= 3e-2).
    test::expect_gradients_near(
        got_g, cpu_g, [](size_t, const std::string& name) { return router_limit(name, {0.06, 0.03}); }, "gradient",
        [&](size_t, const std::string& name, const std::vector<float>& got, const std::vector<float>& cpu) {
          ASSERT_TRUE(io.has("grad." + name)) << name;
          if (std::getenv("MT_PRINT_ERRORS")) {
            const std::vector<float> hf = io.tensor("grad." + name).to_floats();
            std::printf("[ error    ] %s %s: rel-L2 vs transformers fp32 %.2e (cpu bf16 %.2e)\n", bname, name.c_str(),
                        rel_l2(got, hf), rel_l2(cpu, hf));
          }
        });
  }
}

TEST_F(CudaHfFixture, MqaLegacyOneAdamWStepMatchesTransformers) { test::expect_one_cuda_adamw_step_matches(dir_ / "moe_mqa_legacy"); }

// moe_mha_tied_sparse2's head_dim 8 has no flash-attention kernel: refused with the reason named.
TEST_F(CudaHfFixture, HeadDim8FixtureIsRefused) {
  CausalLM m = CausalLM::from_pretrained((dir_ / "moe_mha_tied_sparse2/ckpt").string(), {DType::BF16});
  ASSERT_EQ(m.config.only_attention().head_dim, 8);
  ModelWeights dev_w = to_device_weights(m.weights);
  try {
    DecoderCudaModel model(m.config, dev_w, 0);
    ADD_FAILURE() << "head_dim 8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 8 has no flash-attention kernel"), std::string::npos) << e.what();
  }
}

// ---- The fixtures with dense MLP layers: dense_qwen3 and moe_gqa_aux ----
const char* kDenseVariants[] = {"dense_qwen3", "moe_gqa_aux"};

// Losses on every batch (the real top-2 routing of moe_gqa_aux included) and dense_qwen3's logits of the plain
// batch against Transformers' bf16 run.
// - CE and total loss: 5e-3 relative, as MqaLegacyLossMatchesTransformersBf16 (header). Transformers' own
//   bf16-vs-fp32 move on these batches is 0.5e-4 to 8.5e-4.
// - aux loss (moe_gqa_aux): 1e-2 relative. The top-4-of-4 bound of the header (2^-7 from the bf16 means of
//   the probabilities) plus routing: with top-2 of 8 a near-tie that the two bf16 runs decide differently
//   moves one token's count between two experts, aux by E·|P_a − P_b| / rows (rows = 2 MoE layers × T), about
//   8 · 0.02 / 40 = 4e-3 absolute of an aux of 2.19, 2e-3 relative per flip.
// - logits (our final hidden state times the head, rounded to bf16 as Transformers' bf16 logits are): the
//   distance of Transformers' bf16 logits from its fp32 logits, n (rel-L2 and max-norm, measured here from the
//   fixture: 0.0198 / 0.052 for dense_qwen3, 0.0128 / 0.028 for moe_gqa_aux), is what bf16 rounding does to
//   them; allowing our distance from fp32 to be twice that, the triangle inequality bounds our distance from
//   Transformers' bf16 logits by 3·n (tests/models/cuda/gpu_vs_transformers_test.cpp derives its limits so).
//   Floor: one bf16 step, 2^-8. moe_gqa_aux's logits are not compared: its bf16 router logits are spaced
//   ~0.016 at their magnitudes and its smallest fp64 top-2 margin is about that, so two bf16 runs may route a
//   near-tie token differently, which moves one of 20 rows by O(1) and the tensor's rel-L2 past any rounding
//   bound (the CE above moves ~1e-3 by it); routing is checked decision by decision in GpuVsTransformers.
TEST_F(CudaHfFixture, DenseLossAndLogitsMatchTransformersBf16) {
  for (const char* variant : kDenseVariants) {
    SCOPED_TRACE(variant);
    const fs::path vdir = dir_ / variant;
    const auto meta = read_json(vdir / "meta.json");
    CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
    bool dense = false;
    for (int64_t l = 0; l < m.config.num_layers(); ++l) dense |= !m.config.is_moe_layer(l);
    ASSERT_TRUE(dense);
    ModelWeights dev_w = to_device_weights(m.weights);
    DecoderCudaModel model(m.config, dev_w, 0);
    for (const char* bname : kBatches) {
      SCOPED_TRACE(bname);
      SafetensorsFile io = SafetensorsFile::open((vdir / (std::string(bname) + ".safetensors")).string());
      const auto& ref = meta["batches"][bname]["bf16"];
      const CudaBatch gb = cuda_batch_upload(m.config, load_batch(io), 0);
      const CudaLoss l = model.forward(gb);
      const int64_t count = cuda::to_host(l.count).data_as<int32_t>()[0];
      ASSERT_EQ(count, ref["tokens"].get<int64_t>());
      const double ce = cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(count);
      EXPECT_LE(rel_diff(ce, ref["ce_loss"].get<double>()), 5e-3) << "ce " << ce << " vs " << ref["ce_loss"];
      double loss = ce;
      if (ref["aux_loss"].is_null()) {
        EXPECT_FALSE(model.aux_enabled());
      } else {
        ASSERT_TRUE(l.aux.defined());
        const double aux = cuda::to_host(l.aux).to_floats()[0];
        EXPECT_LE(rel_diff(aux, ref["aux_loss"].get<double>()), 1e-2) << "aux " << aux << " vs " << ref["aux_loss"];
        loss += m.config.aux_loss_coef() * aux;
      }
      EXPECT_LE(rel_diff(loss, ref["loss"].get<double>()), 5e-3) << "loss " << loss << " vs " << ref["loss"];
      if (std::getenv("MT_PRINT_ERRORS"))
        std::printf("[ error    ] %s %s: ce %.7g (transformers %.7g, rel %.2e)\n", variant, bname, ce,
                    ref["ce_loss"].get<double>(), rel_diff(ce, ref["ce_loss"].get<double>()));
      if (std::string(bname) != "plain" || std::string(variant) != "dense_qwen3") continue;

      // Logits of every row (Transformers saved them all), from the final norm's output.
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
      EXPECT_LE(e.rel_l2, std::max(3 * n.rel_l2, floor)) << "logits rel-L2 (transformers bf16 vs fp32: " << n.rel_l2
                                                         << ")";
      EXPECT_LE(e.max_norm, std::max(3 * n.max_norm, floor)) << "logits max-norm (transformers bf16 vs fp32: "
                                                             << n.max_norm << ")";
      if (std::getenv("MT_PRINT_ERRORS"))
        std::printf("[ error    ] %s logits: rel-L2 %.3g max-norm %.3g (limits %.3g, %.3g)\n", variant, e.rel_l2,
                    e.max_norm, std::max(3 * n.rel_l2, floor), std::max(3 * n.max_norm, floor));
    }
  }
}

// Every parameter gradient against the CPU model's bf16 gradients on the same weights and batch, as
// MqaLegacyGradientsMatchCpuBf16 (same limits: max-norm 0.06 / rel-L2 0.03, the router 0.1 / 0.06), each
// raised to 3x the CPU model's own bf16 noise on that tensor where that is larger (the CPU bf16 gradient's
// distance from the CPU fp32 gradient on the same bf16-valued weights; triangle inequality as above), since
// these fixtures' weights (initializer_range 0.3) make some sums cancel more than moe_mqa_legacy's.
// moe_gqa_aux runs with top-k = E = 8 here on both sides (its weights unchanged): every expert takes every
// token, so no near-tie can route a token differently on the two sides (its real top-2 routing is checked
// against Transformers above), and what remains is rounding.
TEST_F(CudaHfFixture, DenseGradientsMatchCpuBf16) {
  for (const char* variant : kDenseVariants) {
    SCOPED_TRACE(variant);
    const fs::path vdir = dir_ / variant;
    CausalLM m = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
    DecoderSpec cfg = m.config;
    for (MoeSpec& moe : cfg.moe) moe.experts_per_token = moe.num_experts;  // none for the dense Qwen3
    ModelWeights w32 = m.weights;             // the same bf16 values as F32: the CPU model in fp32
    for (auto& [name, t] : w32.named_parameters()) *t = t->to(DType::F32);
    ModelWeights dev_w = to_device_weights(m.weights);
    for (const char* bname : kBatches) {
      SCOPED_TRACE(bname);
      SafetensorsFile io = SafetensorsFile::open((vdir / (std::string(bname) + ".safetensors")).string());
      const Batch b = load_batch(io);
      ModelWeights cpu_g = ModelWeights::zeros_like_config(cfg, DType::F32);
      const ForwardResult want = DecoderModel(cfg, m.weights).forward_backward(b, cpu_g);
      ModelWeights cpu32_g = ModelWeights::zeros_like_config(cfg, DType::F32);
      DecoderModel(cfg, w32).forward_backward(b, cpu32_g);

      DecoderCudaModel model(cfg, dev_w, 0);
      const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
      ASSERT_EQ(gb.target_count, want.tokens);
      ModelWeights got_g = device_zeros_like(cfg);
      const CudaLoss l = model.forward_backward(gb, got_g, static_cast<double>(gb.target_count));
      EXPECT_LE(rel_diff(cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(want.tokens), want.ce_loss),
                5e-3);

      auto want_p = cpu_g.named_parameters();
      auto fp32_p = cpu32_g.named_parameters();
      test::expect_gradients_near(
          got_g, cpu_g,
          [&](size_t i, const std::string& name) {
            const test::ErrorStats noise =
                test::error_stats(want_p[i].second->to_floats(), fp32_p[i].second->to_floats());
            const test::GradLimit l = router_limit(name, {0.06, 0.03});
            return test::GradLimit{std::max(l.max_norm, 3 * noise.max_norm), std::max(l.rel_l2, 3 * noise.rel_l2)};
          },
          std::string(bname) + " gradient");
    }
  }
}

// One AdamW step of the dense Qwen3 against Transformers' (as MqaLegacyOneAdamWStepMatchesTransformers: the
// dense MLP's gradients reach the CUDA optimizer like every other parameter's).
TEST_F(CudaHfFixture, DenseQwen3OneAdamWStepMatchesTransformers) { test::expect_one_cuda_adamw_step_matches(dir_ / "dense_qwen3"); }

}  // namespace
}  // namespace mt
