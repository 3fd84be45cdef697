// The Qwen3-MoE / Qwen3 parameter table pinned: names (Transformers' named_parameters() order), shapes, roles,
// uses, init and weight-decay rules, for the qwen3-moe-test preset and its dense, mixed and tied variants.
#include "models/param_table.h"
#include "models/registry.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "models/presets.h"
#include "models/model_weights.h"

namespace mt {
namespace {

DecoderSpec test_preset(const nlohmann::json& overrides = nlohmann::json::object()) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  for (const auto& [k, v] : overrides.items()) j[k] = v;
  return DecoderSpec::from_json(j, "qwen3-moe-test");
}

struct Row {
  std::string name;
  Shape shape;
  ParamRole role;
  ParamUse use;
  ParamInit init;
  bool decay;
  int64_t layer;
};

std::string describe(const Row& r) {
  return fmt::format("{} {} {} use {} init {} decay {} layer {}", r.name, shape_str(r.shape), param_role_name(r.role),
                     static_cast<int>(r.use), static_cast<int>(r.init), r.decay, r.layer);
}

std::vector<Row> rows_of(const ParamTable& t) {
  std::vector<Row> r;
  for (const ParamEntry& e : t.entries()) r.push_back({e.name, e.shape, e.role, e.use, e.init, e.decay, e.layer});
  return r;
}

void expect_rows(const ParamTable& t, const std::vector<Row>& want) {
  const std::vector<Row> have = rows_of(t);
  ASSERT_EQ(have.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(describe(have[i]), describe(want[i])) << "entry " << i;
}

constexpr ParamRole R = ParamRole::replicated, X = ParamRole::expert_stack;
constexpr ParamInit N = ParamInit::normal, O = ParamInit::ones;

// One decoder layer of qwen3-moe-test (H 64, 4 q / 2 kv heads of 16, 8 experts of 32, dense MLP 128).
std::vector<Row> layer_rows(int64_t l, bool moe) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  std::vector<Row> r = {
      {p + "self_attn.q_proj.weight", {64, 64}, R, ParamUse::linear, N, true, l},
      {p + "self_attn.k_proj.weight", {32, 64}, R, ParamUse::linear, N, true, l},
      {p + "self_attn.v_proj.weight", {32, 64}, R, ParamUse::linear, N, true, l},
      {p + "self_attn.o_proj.weight", {64, 64}, R, ParamUse::linear, N, true, l},
      {p + "self_attn.q_norm.weight", {16}, R, ParamUse::norm, O, false, l},
      {p + "self_attn.k_norm.weight", {16}, R, ParamUse::norm, O, false, l},
  };
  if (moe) {
    r.push_back({p + "mlp.gate.weight", {8, 64}, R, ParamUse::router, N, true, l});
    r.push_back({p + "mlp.experts.gate_up_proj", {8, 64, 64}, X, ParamUse::linear, N, true, l});
    r.push_back({p + "mlp.experts.down_proj", {8, 64, 32}, X, ParamUse::linear, N, true, l});
  } else {
    r.push_back({p + "mlp.gate_proj.weight", {128, 64}, R, ParamUse::linear, N, true, l});
    r.push_back({p + "mlp.up_proj.weight", {128, 64}, R, ParamUse::linear, N, true, l});
    r.push_back({p + "mlp.down_proj.weight", {64, 128}, R, ParamUse::linear, N, true, l});
  }
  r.push_back({p + "input_layernorm.weight", {64}, R, ParamUse::norm, O, false, l});
  r.push_back({p + "post_attention_layernorm.weight", {64}, R, ParamUse::norm, O, false, l});
  return r;
}

std::vector<Row> model_rows(const std::vector<bool>& moe_layers, bool tied) {
  std::vector<Row> r = {{"model.embed_tokens.weight", {512, 64}, R, ParamUse::embedding, N, true, -1}};
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    const std::vector<Row> layer = layer_rows(static_cast<int64_t>(l), moe_layers[l]);
    r.insert(r.end(), layer.begin(), layer.end());
  }
  r.push_back({"model.norm.weight", {64}, R, ParamUse::norm, O, false, -1});
  if (!tied) r.push_back({"lm_head.weight", {512, 64}, R, ParamUse::lm_head, N, true, -1});
  return r;
}

TEST(ParamTable, MoeTestPresetIsPinned) {
  const ParamTable t = param_table_of(test_preset());
  expect_rows(t, model_rows({true, true}, false));
  EXPECT_EQ(t.num_experts, 8);
  EXPECT_EQ(t.experts_per_token, 2);
  EXPECT_FALSE(t.tied_embeddings);
  for (const ParamEntry& e : t.entries()) {
    EXPECT_EQ(e.dtype, ParamDType::model) << e.name;
    EXPECT_TRUE(e.trainable) << e.name;
  }
  // The first entries spelled out once more, as Transformers 5.17 lists Qwen3MoeForCausalLM.named_parameters().
  ASSERT_GE(t.entries().size(), 10u);
  const std::vector<std::string> head = {"model.embed_tokens.weight",
                                         "model.layers.0.self_attn.q_proj.weight",
                                         "model.layers.0.self_attn.k_proj.weight",
                                         "model.layers.0.self_attn.v_proj.weight",
                                         "model.layers.0.self_attn.o_proj.weight",
                                         "model.layers.0.self_attn.q_norm.weight",
                                         "model.layers.0.self_attn.k_norm.weight",
                                         "model.layers.0.mlp.gate.weight",
                                         "model.layers.0.mlp.experts.gate_up_proj",
                                         "model.layers.0.mlp.experts.down_proj"};
  for (size_t i = 0; i < head.size(); ++i) EXPECT_EQ(t.entries()[i].name, head[i]);
}

TEST(ParamTable, DenseMixedAndTiedVariants) {
  // mlp_only_layers: layer 1 takes the dense MLP; tied embeddings: no lm_head entry.
  const ParamTable mixed = param_table_of(test_preset({{"mlp_only_layers", {1}}, {"tie_word_embeddings", true}}));
  expect_rows(mixed, model_rows({true, false}, true));
  EXPECT_TRUE(mixed.tied_embeddings);
  // decoder_sparse_step 2: MoE on layers 1, 3, ...
  expect_rows(param_table_of(test_preset({{"decoder_sparse_step", 2}})), model_rows({false, true}, false));
  // A dense Qwen3: no expert stacks at all.
  const ParamTable dense = param_table_of(test_preset(
      {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"num_experts", 0}, {"num_experts_per_tok", 0}}));
  expect_rows(dense, model_rows({false, false}, false));
  EXPECT_EQ(dense.num_experts, 0);
}

TEST(ParamTable, LookupsAndRules) {
  const ParamTable t = param_table_of(test_preset());
  EXPECT_TRUE(t.is_expert_stack("model.layers.1.mlp.experts.down_proj"));
  EXPECT_FALSE(t.is_expert_stack("model.layers.1.mlp.gate.weight"));
  EXPECT_FALSE(t.is_expert_stack("model.layers.1.mlp.experts.3.down_proj.weight"));  // an HF name, not a parameter
  EXPECT_FALSE(t.is_expert_stack("no.such.tensor"));
  EXPECT_EQ(t.find("no.such.tensor"), nullptr);
  const ParamEntry& stack = *t.find("model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(param_shape_held(stack, 2), (Shape{2, 64, 64}));
  EXPECT_EQ(param_shape_held(stack, -1), (Shape{8, 64, 64}));
  EXPECT_EQ(param_numel_per_expert(stack), 64 * 64);
  const ParamEntry& q = *t.find("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(param_shape_held(q, 2), (Shape{64, 64}));  // only expert stacks are sliced

  // The default rules of a use, and a buffer (no Qwen tensor is one): not trained, F32 when asked.
  const ParamEntry bias = param_entry("x.bias", {4}, ParamUse::bias);
  EXPECT_EQ(bias.init, ParamInit::zeros);
  EXPECT_FALSE(bias.decay);
  ParamEntry buf = param_entry("x.e_score_correction_bias", {8}, ParamUse::bias, ParamRole::buffer);
  buf.dtype = ParamDType::f32;
  EXPECT_FALSE(buf.trainable);
  EXPECT_EQ(param_dtype(buf, DType::BF16), DType::F32);
  EXPECT_EQ(param_dtype(q, DType::BF16), DType::BF16);
  ParamTable with_buffer;
  with_buffer.add(param_entry("w", {4, 4}, ParamUse::linear));
  with_buffer.add(buf);
  const ParamCounts c = param_counts(with_buffer);
  EXPECT_EQ(c.total, 16);  // buffers are not parameters
  EXPECT_THROW(with_buffer.add(param_entry("w", {1}, ParamUse::norm)), Error);  // one entry per name
}

TEST(ParamTable, CountsOfThePreset) {
  // qwen3-moe-test: per layer attention 64·64·2 + 32·64·2 + 16·2 + 64·2, router 8·64, experts 8·3·64·32.
  const int64_t attention = 64 * 64 * 2 + 32 * 64 * 2 + 16 * 2 + 64 * 2, router = 8 * 64, experts = 8 * 3 * 64 * 32;
  const ParamCounts c = param_counts(param_table_of(test_preset()));
  EXPECT_EQ(c.total, 2 * 512 * 64 + 64 + 2 * (attention + router + experts));
  EXPECT_EQ(c.experts, 2 * experts);
  EXPECT_EQ(c.active, c.total - 2 * 6 * 3 * 64 * 32);  // 6 of 8 experts idle per token
  EXPECT_EQ(c.embedding, 2 * 512 * 64);
  EXPECT_EQ(c.matmul_per_token, 2 * (64 * 64 * 2 + 32 * 64 * 2 + 2 * 3 * 64 * 32) + 512 * 64);
  // Tied: the embedding is the LM head's matmul.
  const ParamCounts tied = param_counts(param_table_of(test_preset({{"tie_word_embeddings", true}})));
  EXPECT_EQ(tied.embedding, 512 * 64);
  EXPECT_EQ(tied.matmul_per_token, c.matmul_per_token);
}

}  // namespace
}  // namespace mt
