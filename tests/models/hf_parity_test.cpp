// The CPU reference backend against what Transformers 5.17 computed and wrote for the same tiny
// checkpoints (tests/fixtures/qwen3_moe, made by tools/hf_reference/make_model_fixtures.py).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/checkpoint_files.h"
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
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/qwen3_moe";
const char* kVariants[] = {"moe_gqa_aux", "moe_mha_tied_sparse2", "moe_mqa_legacy", "dense_qwen3"};
const char* kBatches[] = {"plain", "packed", "packed2"};

using test::max_abs_diff;
using test::read_bytes;
using test::rel_norm_error;

class HfParity : public ::testing::TestWithParam<const char*> {};

TEST_P(HfParity, Fp32LossLogitsAndGradientsMatchTransformers) {
  const fs::path dir = kFixtures / GetParam();
  const auto meta = read_json(dir / "meta.json");
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::F32});
  for (const char* bname : kBatches) {
    SCOPED_TRACE(bname);
    SafetensorsFile io = SafetensorsFile::open((dir / (std::string(bname) + ".safetensors")).string());
    const auto& ref = meta["batches"][bname]["fp32"];
    Batch b = load_batch(io);
    DecoderModel net(m.config, m.weights);
    ForwardResult fwd = net.forward(b, true);
    EXPECT_LE(std::fabs(fwd.loss - ref["loss"].get<double>()) / std::fabs(ref["loss"].get<double>()), 1e-5);
    EXPECT_LE(std::fabs(fwd.ce_loss - ref["ce_loss"].get<double>()) / ref["ce_loss"].get<double>(), 1e-5);
    if (!ref["aux_loss"].is_null()) {
      EXPECT_NEAR(fwd.aux_loss, ref["aux_loss"].get<double>(), 1e-5 * ref["aux_loss"].get<double>());
    }
    EXPECT_EQ(fwd.tokens, ref["tokens"].get<int64_t>());
    EXPECT_LE(max_abs_diff(fwd.logits.to_floats(), io.tensor("logits").to_floats()), 1e-4);

    ModelWeights grads = ModelWeights::zeros_like_config(m.config, DType::F32);
    ForwardResult fb = net.forward_backward(b, grads);
    // Not bit-equal: training runs the head GEMM on the rows that have a target only (a different M for sgemm).
    // The loss is a mean of per-token terms each within a few ulps; measured ≤ 1.7e-8 relative over OpenBLAS's
    // core types.
    EXPECT_NEAR(fb.loss, fwd.loss, 1e-7 * std::fabs(fwd.loss));
    for (auto& [name, g] : grads.named_parameters()) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(io.has("grad." + name));
      EXPECT_LE(rel_norm_error(g->to_floats(), io.tensor("grad." + name).to_floats()), 1e-4);
    }
  }
}

// The optimizer alone: torch's own gradients in, torch's updated weights out (≤ 1e-5 absolute).
TEST_P(HfParity, OneAdamWStepOnTorchGradientsMatchesTorch) {
  const fs::path dir = kFixtures / GetParam();
  const AdamWOptions o = adamw_options(read_json(dir / "meta.json")["adamw_one_step"]);
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::F32});
  SafetensorsFile io = SafetensorsFile::open((dir / "plain.safetensors").string());
  std::vector<Tensor> torch_grads;
  for (auto& [name, p] : m.weights.named_parameters()) torch_grads.push_back(io.tensor("grad." + name).clone());
  std::vector<const Tensor*> g;
  for (const auto& t : torch_grads) g.push_back(&t);
  AdamW opt(m.weights.named_parameters(), o);
  opt.step(g, o.lr);
  SafetensorsFile after = SafetensorsFile::open((dir / "after_adamw.safetensors").string());
  for (auto& [name, p] : m.weights.named_parameters()) {
    SCOPED_TRACE(name);
    EXPECT_LE(max_abs_diff(p->to_floats(), after.tensor(name).to_floats()), 1e-5);
  }
}

// End to end: our gradients, then our AdamW. Adam's first step moves a weight by lr·g/(|g| + eps), so an
// element whose gradient is near eps (1e-8) amplifies rounding-level gradient differences up to lr; those
// elements (0 < |g| < 1e-6, under 1%) are held to lr; every other element, zero gradients included, to 1e-5.
TEST_P(HfParity, OneAdamWStepEndToEndMatchesTorch) {
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
  for (auto& [name, p] : m.weights.named_parameters()) {
    SCOPED_TRACE(name);
    auto got = p->to_floats(), want = after.tensor(name).to_floats();
    auto gref = io.tensor("grad." + name).to_floats();
    for (size_t i = 0; i < got.size(); ++i, ++total) {
      const bool ill_conditioned = gref[i] != 0.0f && std::fabs(gref[i]) < 1e-6;
      tiny += ill_conditioned;
      ASSERT_LE(std::fabs(double(got[i]) - want[i]), ill_conditioned ? o.lr : 1e-5) << i;
    }
  }
  EXPECT_LT(tiny, total / 100);
}

TEST_P(HfParity, Bf16LossWithinOnePercentOfTransformersBf16) {
  const fs::path dir = kFixtures / GetParam();
  const auto meta = read_json(dir / "meta.json");
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::BF16});
  for (const char* bname : kBatches) {
    SCOPED_TRACE(bname);
    SafetensorsFile io = SafetensorsFile::open((dir / (std::string(bname) + ".safetensors")).string());
    ForwardResult r = DecoderModel(m.config, m.weights).forward(load_batch(io), false);
    const auto& b16 = meta["batches"][bname]["bf16"];
    EXPECT_LE(std::fabs(r.loss - b16["loss"].get<double>()) / b16["loss"].get<double>(), 1e-2);
    EXPECT_LE(std::fabs(r.ce_loss - b16["ce_loss"].get<double>()) / b16["ce_loss"].get<double>(), 1e-2);
    if (!b16["aux_loss"].is_null()) {
      EXPECT_LE(std::fabs(r.aux_loss - b16["aux_loss"].get<double>()) / b16["aux_loss"].get<double>(), 1e-2);
    }
  }
}

TEST_P(HfParity, ConvertRewritesTheSameBytesAndShardMap) {
  test::expect_convert_reproduces(kFixtures / GetParam() / "ckpt", GetParam());
}

INSTANTIATE_TEST_SUITE_P(Variants, HfParity, ::testing::ValuesIn(kVariants));

TEST(HfParityBf16, Bf16CheckpointLoadsAndScores) {
  const fs::path dir = kFixtures / "moe_gqa_aux";
  const auto meta = read_json(dir / "meta.json");
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt_bf16").string());
  EXPECT_EQ(m.dtype, DType::BF16);
  SafetensorsFile io = SafetensorsFile::open((dir / "plain.safetensors").string());
  ForwardResult r = DecoderModel(m.config, m.weights).forward(load_batch(io), true);
  const double ref = meta["batches"]["plain"]["bf16"]["loss"];
  EXPECT_LE(std::fabs(r.loss - ref) / ref, 1e-2);
  SafetensorsFile l16 = SafetensorsFile::open((dir / "plain_bf16_logits.safetensors").string());
  EXPECT_LE(rel_norm_error(r.logits.to_floats(), l16.tensor("logits").to_floats()), 2e-2);
}

}  // namespace
}  // namespace mt
