// Layers of other sublayer lists than Qwen's [attention, MLP | MoE] (tests/models/sublayer_layout_util.h): the
// parameter table lists what each layer has, the CPU model computes a regrouped Qwen model bitwise as the original
// (F32 and BF16), and model_config_check refuses what a layer's weights cannot hold, in one line. The mixed
// layout's gradients are checked by finite differences in ModelGrad.FiniteDifferencesMixedSublayers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/decoder_model.h"
#include "models/presets.h"
#include "models/registry.h"
#include "sublayer_layout_util.h"

namespace mt {
namespace {

using K = SublayerKind;

// Qwen3-MoE, 3 layers: [attention, MoE], [attention, MLP], [attention, MoE]; aux loss on.
DecoderSpec small_spec() {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["num_hidden_layers"] = 3;
  j["mlp_only_layers"] = {1};
  j["hidden_size"] = 32;
  j["intermediate_size"] = 48;
  j["moe_intermediate_size"] = 16;
  j["output_router_logits"] = true;
  j["router_aux_loss_coef"] = 0.05;
  return DecoderSpec::from_json(j, "small_spec");
}

// Two rows of 9 tokens, the second packing two documents; a few labels ignored.
Batch small_batch(int64_t vocab) {
  const int64_t B = 2, S = 9;
  Batch b;
  b.input_ids = Tensor::empty({B, S}, DType::I64);
  b.labels = Tensor::empty({B, S}, DType::I64);
  b.position_ids = Tensor::empty({B, S}, DType::I64);
  uint64_t x = 7;
  for (int64_t i = 0; i < B * S; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    b.input_ids.data_as<int64_t>()[i] = static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab));
    b.labels.data_as<int64_t>()[i] = i % 5 == 2 ? -100 : b.input_ids.data_as<int64_t>()[i];
    const int64_t t = i % S;
    b.position_ids.data_as<int64_t>()[i] = i < S ? t : (t < 4 ? t : t - 4);
  }
  return b;
}

std::vector<std::string> layer_names(const ParamTable& t, int64_t layer) {
  std::vector<std::string> names;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  for (const ParamEntry& e : t.entries())
    if (e.layer == layer) names.push_back(e.name.substr(p.size()));
  return names;
}

TEST(SublayerLayout, ParamTableListsEachLayersSublayers) {
  const DecoderSpec s = test::with_layout(small_spec(), test::mixed_layout());
  const ParamTable t = param_table_of(s);
  const std::vector<std::string> attn = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                         "self_attn.q_norm.weight", "self_attn.k_norm.weight"};
  const std::vector<std::string> moe = {"mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
  const std::vector<std::string> mlp = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
  auto cat = [](std::vector<std::vector<std::string>> parts) {
    std::vector<std::string> all;
    for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  const std::string in = "input_layernorm.weight", post = "post_attention_layernorm.weight";
  // The table's order is Transformers' (attention, then MLP or MoE, then the two norms), whatever the execution
  // order of the sublayers.
  EXPECT_EQ(layer_names(t, 0), cat({attn, moe, {in, post}}));
  EXPECT_EQ(layer_names(t, 1), cat({moe, {post}}));
  EXPECT_EQ(layer_names(t, 2), cat({attn, {in}}));
  EXPECT_EQ(layer_names(t, 3), cat({attn, mlp, {in, post}}));
  EXPECT_EQ(layer_names(t, 4), cat({attn, mlp, {in, post}}));
  // The slots the blocks read: a sublayer's absent kinds stay empty.
  const ModelWeights w = ModelWeights::random_init(s, DType::F32, 3);
  EXPECT_FALSE(w.layers[1].q_proj.defined());
  EXPECT_FALSE(w.layers[1].input_norm.defined());
  EXPECT_TRUE(w.layers[1].post_norm.defined());
  EXPECT_TRUE(w.layers[2].input_norm.defined());
  EXPECT_FALSE(w.layers[2].post_norm.defined());
  EXPECT_FALSE(w.layers[2].router.defined());
  EXPECT_TRUE(w.layers[3].mlp_down.defined());
  EXPECT_FALSE(w.layers[3].experts_down.defined());
}

// Every tensor of `got` (a regrouped model's) equals its original in `want`, bit for bit.
void expect_regrouped_bitwise(const DecoderSpec& s, const std::vector<int>& sizes, const ModelWeights& want,
                              const ModelWeights& got, const std::string& what) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : got.named_parameters()) by_name[name] = t;
  size_t n = 0;
  for (const auto& [name, t] : want.named_parameters()) {
    const Tensor& g = *by_name.at(test::regrouped_name(s, sizes, name));
    ASSERT_EQ(g.shape(), t->shape()) << what << " " << name;
    EXPECT_EQ(std::memcmp(g.data(), t->data(), t->nbytes()), 0) << what << " " << name << " differs";
    ++n;
  }
  EXPECT_EQ(n, by_name.size());
}

// The sublayers of a Qwen3-MoE model cut into layers of other sizes: one sublayer alone, MoE or MLP before an
// attention. Every sublayer reads the same weights and adds to the same stream, so loss, logits and every
// gradient are bitwise the original's.
TEST(SublayerLayout, RegroupedLayersComputeTheQwenModelBitwise) {
  const DecoderSpec s = small_spec();
  const Batch b = small_batch(s.vocab_size);
  for (DType dt : {DType::F32, DType::BF16}) {
    ModelWeights w = ModelWeights::random_init(s, dt, 5);
    ModelWeights g = ModelWeights::zeros_like_config(s, DType::F32);
    DecoderModel m(s, w);
    const ForwardResult want = m.forward_backward(b, g);
    const std::vector<float> want_logits = m.forward(b, true).logits.to_floats();
    ASSERT_GT(want.aux_loss, 0.0);
    const std::vector<std::vector<int>> regroupings = {{2, 1, 2, 1}, {1, 2, 1, 1, 1}, {1, 1, 1, 1, 1, 1}};
    for (const std::vector<int>& sizes : regroupings) {
      const DecoderSpec r = test::regrouped(s, sizes);
      SCOPED_TRACE(std::string(dtype_safetensors_name(dt)) + ", " + std::to_string(r.num_layers()) + " layers");
      ModelWeights rw = test::regrouped_weights(s, sizes, w);
      ModelWeights rg = ModelWeights::zeros_like_config(r, DType::F32);
      DecoderModel rm(r, rw);
      const ForwardResult got = rm.forward_backward(b, rg);
      EXPECT_EQ(got.loss, want.loss);
      EXPECT_EQ(got.ce_loss, want.ce_loss);
      EXPECT_EQ(got.aux_loss, want.aux_loss);
      EXPECT_EQ(rm.forward(b, true).logits.to_floats(), want_logits);
      expect_regrouped_bitwise(s, sizes, g, rg, "gradient");
    }
  }
}

// The mixed layout on the CPU: forward and forward_backward agree, every gradient is finite and moves.
TEST(SublayerLayout, MixedLayoutTrainsOnTheCpu) {
  const DecoderSpec s = test::with_layout(small_spec(), test::mixed_layout());
  const Batch b = small_batch(s.vocab_size);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_safetensors_name(dt));
    ModelWeights w = ModelWeights::random_init(s, dt, 9);
    ModelWeights g = ModelWeights::zeros_like_config(s, DType::F32);
    DecoderModel m(s, w);
    const ForwardResult r = m.forward_backward(b, g);
    EXPECT_TRUE(std::isfinite(r.loss));
    EXPECT_GT(r.aux_loss, 0.0);
    EXPECT_EQ(m.forward(b, false).loss, r.loss);
    for (const auto& [name, t] : g.named_parameters()) {
      double sq = 0;
      for (float v : t->to_floats()) {
        ASSERT_TRUE(std::isfinite(v)) << name;
        sq += double(v) * v;
      }
      EXPECT_GT(sq, 0.0) << name;
    }
  }
}

void expect_refused(const DecoderSpec& s, const std::string& needle) {
  try {
    model_config_check(s);
    ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// A layer's weights hold one attention and one MLP or MoE sublayer (the norm slot is chosen by kind).
TEST(SublayerLayout, RefusesLayersTheWeightsCannotHold) {
  const DecoderSpec s = small_spec();
  expect_refused(test::with_layout(s, {{K::attention, K::moe}, {K::attention, K::mlp, K::attention}}),
                 "config: layer 1 has 2 attention and 1 MLP/MoE sublayers; a layer holds at most one of each");
  expect_refused(test::with_layout(s, {{K::attention, K::moe}, {}}), "config: layer 1 has no sublayer");
  expect_refused(test::with_layout(s, {{K::mlp, K::attention, K::moe}}),
                 "config: layer 0 has 1 attention and 2 MLP/MoE sublayers");
  expect_refused(test::regrouped(s, {3, 3}), "config: layer 0 has 2 attention and 1 MLP/MoE sublayers");
  DecoderSpec bad_index = s;
  bad_index.layers[2].sublayers[1].index = 4;
  expect_refused(bad_index, "layer 2: moe sublayer refers to configuration 4 of 1");
  // The model refuses it before reading a weight.
  const DecoderSpec two = test::with_layout(s, {{K::attention, K::attention}});
  ModelWeights w = ModelWeights::random_init(s, DType::F32, 1);
  EXPECT_THROW({ DecoderModel m(two, w); }, Error);
}

}  // namespace
}  // namespace mt
