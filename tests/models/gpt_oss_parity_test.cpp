// The CPU engine on GPT-OSS against what Transformers 5.17 computed for the same tiny checkpoints
// (tests/fixtures/gpt_oss, made by tools/hf_reference/make_family_fixtures.py --family gpt_oss): fp32 loss, logits
// and every gradient, one AdamW step, the 5-step trajectory, bf16 within the bf16 rounding, the MXFP4 checkpoint.
// Gradients and weights are compared in Transformers' layout: the engine's are written back through the family's
// checkpoint rules (ModelWeights::to_hf), which GPT-OSS saves as Transformers holds them in memory.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>

#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "hf_fixture_util.h"
#include "train/adamw.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using test::adamw_options;
using test::load_batch;
using test::read_json;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/gpt_oss";
const char* kVariants[] = {"yarn_window_aux", "tied_mqa_default_rope"};

using test::max_abs_diff;
using test::rel_norm_error;

// Tensors of a ModelWeights-shaped struct (parameters or gradients) by Transformers' names and layout.
std::map<std::string, std::vector<float>> in_hf_layout(const DecoderSpec& cfg, const ModelWeights& w) {
  std::map<std::string, std::vector<float>> r;
  for (const auto& [name, t] : w.to_hf(cfg)) r[name] = t.to_floats();
  return r;
}

class GptOssParity : public ::testing::TestWithParam<const char*> {};

TEST_P(GptOssParity, Fp32LossLogitsAndGradientsMatchTransformers) {
  const fs::path dir = kFixtures / GetParam();
  const auto ref = read_json(dir / "meta.json")["batches"]["plain"]["fp32"];
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::F32});
  SafetensorsFile io = SafetensorsFile::open((dir / "plain.safetensors").string());
  const Batch b = load_batch(io);
  DecoderModel net(m.config, m.weights);
  const ForwardResult fwd = net.forward(b, true);
  EXPECT_LE(std::fabs(fwd.loss - ref["loss"].get<double>()) / ref["loss"].get<double>(), 1e-5);
  EXPECT_LE(std::fabs(fwd.ce_loss - ref["ce_loss"].get<double>()) / ref["ce_loss"].get<double>(), 1e-5);
  if (!ref["aux_loss"].is_null()) {
    EXPECT_NEAR(fwd.aux_loss, ref["aux_loss"].get<double>(), 1e-5 * ref["aux_loss"].get<double>());
  }
  EXPECT_EQ(fwd.tokens, ref["tokens"].get<int64_t>());
  EXPECT_LE(max_abs_diff(fwd.logits.to_floats(), io.tensor("logits").to_floats()), 1e-4);

  ModelWeights grads = ModelWeights::zeros_like_config(m.config, DType::F32);
  const ForwardResult fb = net.forward_backward(b, grads);
  EXPECT_NEAR(fb.loss, fwd.loss, 1e-7 * fwd.loss);
  int compared = 0;
  for (const auto& [name, g] : in_hf_layout(m.config, grads)) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(io.has("grad." + name));
    EXPECT_LE(rel_norm_error(g, io.tensor("grad." + name).to_floats()), 1e-4);
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(m.weights.named_parameters().size()));
}

// Our gradients, then our AdamW (torch's: every parameter decays), against torch's weights after its step. As in
// the Qwen3 parity test, elements whose nonzero gradient is below 1e-6 (Adam divides by |g| + eps) are held to lr.
TEST_P(GptOssParity, OneAdamWStepEndToEndMatchesTorch) {
  const fs::path dir = kFixtures / GetParam();
  const AdamWOptions o = adamw_options(read_json(dir / "meta.json")["adamw_one_step"]);
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::F32});
  SafetensorsFile io = SafetensorsFile::open((dir / "plain.safetensors").string());
  ModelWeights grads = ModelWeights::zeros_like_config(m.config, DType::F32);
  DecoderModel(m.config, m.weights).forward_backward(load_batch(io), grads);
  std::vector<const Tensor*> g;
  for (auto& [name, t] : grads.named_parameters()) g.push_back(t);
  AdamW opt(m.weights.named_parameters(), o);
  opt.step(g, o.lr);
  SafetensorsFile after = SafetensorsFile::open((dir / "after_adamw.safetensors").string());
  int64_t tiny = 0, total = 0;
  for (const auto& [name, got] : in_hf_layout(m.config, m.weights)) {
    SCOPED_TRACE(name);
    const auto want = after.tensor(name).to_floats();
    const auto gr = io.tensor("grad." + name).to_floats();  // torch's
    for (size_t i = 0; i < got.size(); ++i, ++total) {
      const bool ill_conditioned = gr[i] != 0.0f && std::fabs(gr[i]) < 1e-6;
      tiny += ill_conditioned;
      ASSERT_LE(std::fabs(double(got[i]) - want[i]), ill_conditioned ? o.lr : 1e-5) << i;
    }
  }
  EXPECT_LT(tiny, total / 100);
}

// bf16: Transformers rounds per eager op; the CPU bf16 path rounds at the same points but sums in other orders
// (and its GEMMs are not cuBLAS's), so loss within 1% and logits within 2% relative L2, as for Qwen3.
TEST_P(GptOssParity, Bf16LossAndLogitsCloseToTransformersBf16) {
  const fs::path dir = kFixtures / GetParam();
  const auto b16 = read_json(dir / "meta.json")["batches"]["plain"]["bf16"];
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::BF16});
  SafetensorsFile io = SafetensorsFile::open((dir / "plain.safetensors").string());
  const ForwardResult r = DecoderModel(m.config, m.weights).forward(load_batch(io), true);
  EXPECT_LE(std::fabs(r.loss - b16["loss"].get<double>()) / b16["loss"].get<double>(), 1e-2);
  if (!b16["aux_loss"].is_null()) {
    EXPECT_LE(std::fabs(r.aux_loss - b16["aux_loss"].get<double>()) / b16["aux_loss"].get<double>(), 1e-2);
  }
  SafetensorsFile l16 = SafetensorsFile::open((dir / "plain_bf16_logits.safetensors").string());
  EXPECT_LE(rel_norm_error(r.logits.to_floats(), l16.tensor("logits").to_floats()), 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Variants, GptOssParity, ::testing::ValuesIn(kVariants));

// Five AdamW steps (lr 1e-3, constant, no clipping) on one 40-token sequence, against Transformers' losses and
// final weights.
TEST(GptOssTrain5, TrajectoryAndFinalWeightsMatchTransformers) {
  const fs::path dir = kFixtures / "train5";
  const auto meta = read_json(dir / "meta.json");
  CausalLM m = CausalLM::from_pretrained((kFixtures / "yarn_window_aux" / "ckpt").string(), {DType::F32});
  const auto& p = meta["packed"];
  const int64_t n = static_cast<int64_t>(p["input_ids"].size());
  Batch b;
  b.input_ids = Tensor::empty({1, n}, DType::I64);
  b.labels = Tensor::empty({1, n}, DType::I64);
  for (int64_t i = 0; i < n; ++i) {
    b.input_ids.data_as<int64_t>()[i] = p["input_ids"][i].get<int64_t>();
    b.labels.data_as<int64_t>()[i] = p["labels"][i].get<int64_t>();
  }
  const AdamWOptions o = adamw_options(meta["adamw"]);
  AdamW opt(m.weights.named_parameters(), o);
  DecoderModel net(m.config, m.weights);
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(step);
    ModelWeights grads = ModelWeights::zeros_like_config(m.config, DType::F32);
    const ForwardResult r = net.forward_backward(b, grads);
    const double want = meta["steps"][step]["loss"].get<double>();
    EXPECT_LE(std::fabs(r.loss - want) / want, 1e-4);
    std::vector<const Tensor*> g;
    for (auto& [name, t] : grads.named_parameters()) g.push_back(t);
    opt.step(g, o.lr);
  }
  CausalLM final_hf = CausalLM::from_pretrained((dir / "final").string(), {DType::F32});
  const auto want = in_hf_layout(final_hf.config, final_hf.weights);
  for (const auto& [name, got] : in_hf_layout(m.config, m.weights)) {
    SCOPED_TRACE(name);
    EXPECT_LE(max_abs_diff(got, want.at(name)), 1e-4);
  }
}

// The MXFP4 checkpoint runs as the dequantised bf16 model Transformers loads (its bf16 CPU forward: loss in
// meta.json, logits in ckpt_mxfp4_logits.safetensors), within the bf16 tolerances above.
TEST(GptOssMxfp4, Bf16ForwardOfTheDequantisedCheckpointMatchesTransformers) {
  const fs::path dir = kFixtures / "yarn_window_aux";
  const auto meta = read_json(dir / "meta.json");
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt_mxfp4").string());
  ASSERT_EQ(m.dtype, DType::BF16);
  SafetensorsFile io = SafetensorsFile::open((dir / "plain.safetensors").string());
  const ForwardResult r = DecoderModel(m.config, m.weights).forward(load_batch(io), true);
  const double want = meta["mxfp4"]["loads"]["explicit_dequantize_cpu"]["plain_loss"].get<double>();
  EXPECT_LE(std::fabs(r.loss - want) / want, 1e-2);
  SafetensorsFile lg = SafetensorsFile::open((dir / "ckpt_mxfp4_logits.safetensors").string());
  EXPECT_LE(rel_norm_error(r.logits.to_floats(), lg.tensor("logits.explicit_dequantize_cpu").to_floats()), 2e-2);
}

// Transformers' greedy generate() (use_cache=True, fp32): the cached path runs the window and the sinks (the longest
// prompt, 37 tokens, is far past the 4-token window).
TEST_P(GptOssParity, GreedyGenerationEqualsTransformers) { test::expect_greedy_equals_goldens(kFixtures / GetParam()); }

}  // namespace
}  // namespace mt
