// GPT-OSS as a family (issue 38, first part): config.json -> spec, the parameter table, loading the
// Transformers-made fixture checkpoints (fp32 and MXFP4, tests/fixtures/gpt_oss) into the engines' layout, and
// `convert` writing what Transformers writes. The model math comes with the blocks.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/param_table.h"
#include "models/presets.h"
#include "models/registry.h"
#include "models/spec/config_writer.h"
#include "hf_fixture_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using test::read_json;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/gpt_oss";

DecoderSpec spec_of(const char* variant) {
  return DecoderSpec::from_file((kFixtures / variant / "ckpt" / "config.json").string());
}

TEST(GptOssFamily, ParsesTheFixtureConfigs) {
  const DecoderSpec s = spec_of("yarn_window_aux");
  EXPECT_EQ(s.architecture, "GptOssForCausalLM");
  EXPECT_EQ(s.norm_rounding, NormRounding::gpt_oss);
  EXPECT_EQ(s.num_layers(), 2);
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-5);
  // layer_types: [sliding, full]; sliding_window 4.
  ASSERT_NE(s.attention_of(0), nullptr);
  EXPECT_EQ(s.attention_of(0)->sliding_window, 4);
  EXPECT_EQ(s.attention_of(1)->sliding_window, 0);
  const AttentionSpec& a = *s.attention_of(1);
  EXPECT_EQ(a.heads, 4);
  EXPECT_EQ(a.kv_heads, 2);
  EXPECT_EQ(a.head_dim, 16);
  EXPECT_TRUE(a.qkv_bias && a.o_bias && a.sinks);
  EXPECT_FALSE(a.qk_norm);
  EXPECT_EQ(a.rope.kind, RopeKind::yarn);
  EXPECT_DOUBLE_EQ(a.rope.theta, 150000.0);
  EXPECT_DOUBLE_EQ(a.rope.factor, 32.0);
  EXPECT_EQ(a.rope.original_max_position, 4096);
  EXPECT_FALSE(a.rope.truncate);
  EXPECT_DOUBLE_EQ(a.rope.attention_factor, 0.1 * std::log(32.0) + 1.0);  // hf-numerics.md §4.2: ≈ 1.34657
  const MoeSpec& m = *s.moe_of(0);
  EXPECT_EQ(m.num_experts, 4);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_EQ(m.expert.intermediate_size, 32);
  EXPECT_EQ(m.expert.activation, Activation::swiglu_oai);
  EXPECT_TRUE(m.expert.bias && m.router.linear_bias);
  EXPECT_EQ(m.router.score, RouterScore::topk_softmax);
  EXPECT_TRUE(m.aux_loss_on);
  EXPECT_DOUBLE_EQ(m.aux_loss_coef, 0.02);

  const DecoderSpec t = spec_of("tied_mqa_default_rope");
  EXPECT_TRUE(t.tie_word_embeddings);
  EXPECT_EQ(t.attention_of(0)->sliding_window, 0);  // [full, sliding]
  EXPECT_EQ(t.attention_of(1)->sliding_window, 6);
  EXPECT_EQ(t.attention_of(0)->rope.kind, RopeKind::standard);
  EXPECT_DOUBLE_EQ(t.attention_of(0)->rope.theta, 10000.0);
  EXPECT_EQ(t.attention_of(0)->kv_heads, 1);
  EXPECT_EQ(t.moe_of(1)->experts_per_token, 3);
}

// Transformers' GptOssConfig defaults when fields are absent, and the hub's spellings.
TEST(GptOssFamily, DefaultsAndHubSpellings) {
  nlohmann::json j = {{"architectures", {"GptOssForCausalLM"}}, {"model_type", "gpt_oss"},
                      {"num_hidden_layers", 3},                 {"num_experts", 8},
                      {"experts_per_token", 2},                 {"rope_theta", 150000},
                      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 32.0}, {"original_max_position_embeddings", 4096},
                                        {"truncate", false}}}};
  const DecoderSpec s = DecoderSpec::from_json(j, "config.json");
  EXPECT_EQ(s.hidden_size, 2880);
  EXPECT_EQ(s.vocab_size, 201088);
  EXPECT_EQ(s.attention_of(0)->heads, 64);
  EXPECT_EQ(s.attention_of(0)->kv_heads, 8);
  EXPECT_EQ(s.attention_of(0)->head_dim, 64);
  // Without layer_types even layers slide (window 128), odd ones do not.
  EXPECT_EQ(s.attention_of(0)->sliding_window, 128);
  EXPECT_EQ(s.attention_of(1)->sliding_window, 0);
  EXPECT_EQ(s.attention_of(2)->sliding_window, 128);
  EXPECT_EQ(s.num_experts(), 8);
  EXPECT_EQ(s.experts_per_token(), 2);
  EXPECT_EQ(s.attention_of(0)->rope.kind, RopeKind::yarn);
  // Saved in v5 spellings: num_local_experts, num_experts_per_tok, rope_parameters, layer_types.
  const nlohmann::json out = s.to_json();
  EXPECT_EQ(out["num_local_experts"], 8);
  EXPECT_EQ(out["num_experts_per_tok"], 2);
  EXPECT_FALSE(out.contains("num_experts") || out.contains("experts_per_token") || out.contains("rope_scaling") ||
               out.contains("rope_theta"));
  EXPECT_EQ(out["rope_parameters"]["rope_type"], "yarn");
  EXPECT_EQ(out["rope_parameters"]["rope_theta"], 150000.0);
  EXPECT_EQ(out["layer_types"], nlohmann::json({"sliding_attention", "full_attention", "sliding_attention"}));
  // ... and parse back to the same layers.
  const DecoderSpec back = DecoderSpec::from_json(out, "config.json");
  for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(back.attention_of(l)->sliding_window, s.attention_of(l)->sliding_window);
}

TEST(GptOssFamily, HostileConfigsNameTheField) {
  const nlohmann::json base = read_json(kFixtures / "yarn_window_aux" / "ckpt" / "config.json");
  auto expect_bad = [&](const char* field, const nlohmann::json& value, const char* fragment) {
    nlohmann::json j = base;
    j[field] = value;
    try {
      DecoderSpec::from_json(j, "cfg.json");
      ADD_FAILURE() << field << " = " << value.dump() << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  expect_bad("layer_types", {"sliding_attention"}, "layer_types");
  expect_bad("layer_types", {"sliding_attention", "linear_attention"}, "layer_types[1]");
  expect_bad("layer_types", "full_attention", "layer_types");
  expect_bad("num_key_value_heads", 3, "num_key_value_heads");
  expect_bad("head_dim", 15, "head_dim");
  expect_bad("num_experts_per_tok", 5, "num_experts_per_tok");
  expect_bad("swiglu_limit", 5.0, "swiglu_limit");
  expect_bad("rope_parameters", {{"rope_type", "longrope"}}, "rope_parameters.rope_type");
  expect_bad("rope_parameters", {{"rope_type", "yarn"}, {"factor", -2}}, "rope_parameters.factor");
  expect_bad("rope_parameters", "yarn", "rope_parameters");
  expect_bad("rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1.0}}, "rope_parameters.rope_theta");
  expect_bad("rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 0.5}}, "rope_parameters.rope_theta");
  {
    nlohmann::json j = base;
    j.erase("rope_parameters");
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
    j["rope_theta"] = 1.0;
    EXPECT_THROW(
        {
          try {
            DecoderSpec::from_json(j, "cfg.json");
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("cfg.json: field 'rope_theta'"), std::string::npos) << e.what();
            throw;
          }
        },
        Error);
  }
  expect_bad("sliding_window", 0, "sliding_window");
  expect_bad("pad_token_id", 128, "pad_token_id");  // vocab_size 128: nn.Embedding refuses padding_idx 128
  expect_bad("pad_token_id", "<|endoftext|>", "pad_token_id");
  expect_bad("quantization_config", {{"quant_method", "mxfp4"}, {"modules_to_not_convert", {1}}},
             "quantization_config.modules_to_not_convert[0]");
}

// GptOssModel builds nn.Embedding(V, H, pad_token_id): the fixtures' pad_token_id 0 and the hub's 199999
// (<|endoftext|>) are the padding index.
TEST(GptOssFamily, PadTokenIdIsThePaddingIdx) {
  for (const char* variant : {"yarn_window_aux", "tied_mqa_default_rope"})
    EXPECT_EQ(spec_of(variant).padding_idx, std::optional<int64_t>(0)) << variant;
  for (const char* preset : {"gpt-oss-20b", "gpt-oss-120b"})
    EXPECT_EQ(DecoderSpec::from_json(preset_config_json(preset), preset).padding_idx, std::optional<int64_t>(199999));
  nlohmann::json j = read_json(kFixtures / "yarn_window_aux" / "ckpt" / "config.json");
  j.erase("pad_token_id");  // GptOssConfig's default: None
  EXPECT_FALSE(DecoderSpec::from_json(j, "c.json").padding_idx.has_value());
}

// Transformers' _init_weights zeroes the padding_idx row: both fixture checkpoints (random init, pad_token_id 0)
// hold a zero row 0 and normal rows elsewhere. CausalLM::from_config (what `mixtune init` runs, then saves) does
// the same, and only that: without a padding index every other row is bit for bit the same draw.
TEST(GptOssFamily, RandomInitZeroesThePadRowAsTransformersDoes) {
  for (const char* variant : {"yarn_window_aux", "tied_mqa_default_rope"}) {
    SCOPED_TRACE(variant);
    const DecoderSpec spec = spec_of(variant);
    const int64_t H = spec.hidden_size;
    const CausalLM hf = CausalLM::from_pretrained((kFixtures / variant / "ckpt").string());
    const std::vector<float> hf_embed = hf.weights.embed.to_floats();
    EXPECT_EQ(std::vector<float>(hf_embed.begin(), hf_embed.begin() + H), std::vector<float>(H, 0.0f));
    EXPECT_NE(std::vector<float>(hf_embed.begin() + H, hf_embed.begin() + 2 * H), std::vector<float>(H, 0.0f));
    DecoderSpec no_pad = spec;
    no_pad.padding_idx.reset();
    for (DType dt : {DType::F32, DType::BF16}) {
      const CausalLM ours = CausalLM::from_config(spec, dt, 7), plain = CausalLM::from_config(no_pad, dt, 7);
      const std::vector<float> e = ours.weights.embed.to_floats(), p = plain.weights.embed.to_floats();
      ASSERT_EQ(e.size(), hf_embed.size());
      EXPECT_EQ(std::vector<float>(e.begin(), e.begin() + H), std::vector<float>(H, 0.0f));
      EXPECT_NE(std::vector<float>(p.begin(), p.begin() + H), std::vector<float>(H, 0.0f));
      EXPECT_EQ(std::vector<float>(e.begin() + H, e.end()), std::vector<float>(p.begin() + H, p.end()));
    }
    // Saved and loaded back (the checkpoint `mixtune init` writes), the row stays zero.
    const fs::path out = fs::temp_directory_path() / (std::string("mt_gpt_oss_pad_init_") + variant);
    fs::remove_all(out);
    CausalLM::from_config(spec, DType::BF16, 7).save_pretrained(out.string());
    const std::vector<float> back = CausalLM::from_pretrained(out.string()).weights.embed.to_floats();
    EXPECT_EQ(std::vector<float>(back.begin(), back.begin() + H), std::vector<float>(H, 0.0f));
    fs::remove_all(out);
  }
}

// Transformers' named_parameters() order (a module's own parameters first: sinks before q_proj), names and shapes
// in the engines' layout.
TEST(GptOssFamily, ParameterTableFollowsTransformers) {
  const DecoderSpec s = spec_of("yarn_window_aux");
  const ParamTable t = param_table_of(s);
  std::vector<std::string> names;
  for (const ParamEntry& e : t.entries()) names.push_back(e.name);
  const std::vector<std::string> layer0 = {
      "model.layers.0.self_attn.sinks",          "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.q_proj.bias",    "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.k_proj.bias",    "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.v_proj.bias",    "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.self_attn.o_proj.bias",    "model.layers.0.mlp.router.weight",
      "model.layers.0.mlp.router.bias",          "model.layers.0.mlp.experts.gate_up_proj",
      "model.layers.0.mlp.experts.gate_up_proj_bias", "model.layers.0.mlp.experts.down_proj",
      "model.layers.0.mlp.experts.down_proj_bias",    "model.layers.0.input_layernorm.weight",
      "model.layers.0.post_attention_layernorm.weight"};
  ASSERT_EQ(names.size(), 1 + 2 * layer0.size() + 2);
  EXPECT_EQ(names[0], "model.embed_tokens.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 1, names.begin() + 1 + layer0.size()), layer0);
  EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_EQ(t.find("model.layers.1.mlp.experts.gate_up_proj")->shape, (Shape{4, 64, 32}));  // [E, 2I, H]
  EXPECT_EQ(t.find("model.layers.1.mlp.experts.down_proj")->shape, (Shape{4, 32, 32}));     // [E, H, I]
  EXPECT_EQ(t.find("model.layers.1.mlp.experts.gate_up_proj_bias")->role, ParamRole::expert_stack);
  EXPECT_EQ(t.find("model.layers.1.mlp.experts.down_proj_bias")->role, ParamRole::expert_stack);
  // HF Trainer decays no name containing "bias"; the sinks are decayed. Transformers' init: sinks and the router
  // bias normal, the other biases zero.
  EXPECT_FALSE(t.find("model.layers.0.mlp.router.bias")->decay);
  EXPECT_FALSE(t.find("model.layers.0.self_attn.q_proj.bias")->decay);
  EXPECT_TRUE(t.find("model.layers.0.self_attn.sinks")->decay);
  EXPECT_EQ(t.find("model.layers.0.self_attn.sinks")->init, ParamInit::normal);
  EXPECT_EQ(t.find("model.layers.0.mlp.router.bias")->init, ParamInit::normal);
  EXPECT_EQ(t.find("model.layers.0.mlp.experts.down_proj_bias")->init, ParamInit::zeros);
  // Transformers' num_parameters() for this model, from the fixture's meta.json.
  EXPECT_EQ(param_counts(t).total, read_json(kFixtures / "yarn_window_aux" / "meta.json")["hf"]["parameters"]);
}

// Engine layout vs Transformers' in-memory [E, H, 2I] interleaved gate/up and [E, I, H] down.
void expect_experts_match_hf(const ModelWeights& w, const SafetensorsFile& hf, const std::string& prefix) {
  const int64_t L = static_cast<int64_t>(w.layers.size());
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = prefix + "model.layers." + std::to_string(l) + ".mlp.experts.";
    const std::vector<float> gu = hf.tensor(p + "gate_up_proj").to_floats();
    const std::vector<float> gub = hf.tensor(p + "gate_up_proj_bias").to_floats();
    const std::vector<float> dn = hf.tensor(p + "down_proj").to_floats();
    const Tensor& egu = w.layers[l].experts_gate_up;
    const Tensor& edn = w.layers[l].experts_down;
    const std::vector<float> mgu = egu.to_floats(), mgub = w.layers[l].experts_gate_up_bias.to_floats(),
                             mdn = edn.to_floats();
    const int64_t E = egu.dim(0), I2 = egu.dim(1), H = egu.dim(2), I = I2 / 2;
    int64_t bad = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < I2; ++r) {
        const int64_t col = r < I ? 2 * r : 2 * (r - I) + 1;  // gate rows from even columns, up rows from odd
        for (int64_t h = 0; h < H; ++h) bad += mgu[(e * I2 + r) * H + h] != gu[(e * H + h) * I2 + col];
        bad += mgub[e * I2 + r] != gub[e * I2 + col];
        for (int64_t h = 0; h < H; ++h) bad += mdn[(e * H + h) * I + (r % I)] != dn[(e * I + r % I) * H + h];
      }
    EXPECT_EQ(bad, 0) << p;
  }
}

TEST(GptOssFamily, LoadsTheFp32CheckpointInTheEngineLayout) {
  const fs::path dir = kFixtures / "yarn_window_aux";
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string());
  EXPECT_EQ(m.dtype, DType::F32);
  SafetensorsFile ck = SafetensorsFile::open((dir / "ckpt" / "model-00001-of-00007.safetensors").string());
  EXPECT_EQ(m.weights.layers[0].sinks.to_floats(), ck.tensor("model.layers.0.self_attn.sinks").to_floats());
  EXPECT_EQ(m.weights.layers[0].q_bias.to_floats(), ck.tensor("model.layers.0.self_attn.q_proj.bias").to_floats());
  // The gradient file names Transformers' in-memory tensors; pair the experts with the checkpoint's via the saved
  // model (save writes the hub layout back).
  const fs::path out = fs::temp_directory_path() / "mt_gpt_oss_load";
  fs::remove_all(out);
  SaveOptions so;
  so.max_shard_bytes = int64_t{1} << 30;
  m.save_pretrained(out.string(), so);
  expect_experts_match_hf(m.weights, SafetensorsFile::open((out / "model.safetensors").string()), "");
  fs::remove_all(out);
}

// hf-numerics.md §8.5: MXFP4 experts dequantised at load to exactly what Transformers loads (its bf16 tensors,
// written by the fixture generator after from_pretrained), and the rest bf16 as stored.
TEST(GptOssFamily, Mxfp4CheckpointLoadsAsTransformersDequantisesIt) {
  const fs::path dir = kFixtures / "yarn_window_aux";
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt_mxfp4").string());
  EXPECT_EQ(m.dtype, DType::BF16);
  const SafetensorsFile hf = SafetensorsFile::open((dir / "ckpt_mxfp4_hf_loaded.safetensors").string());
  expect_experts_match_hf(m.weights, hf, "");
  for (const auto& [name, t] : m.weights.named_parameters()) {
    if (m.weights.param_table().is_expert_stack(name)) continue;
    SCOPED_TRACE(name);
    EXPECT_EQ(t->to_floats(), hf.tensor(name).to_floats());
  }
}

TEST(GptOssFamily, ConvertRewritesTheSameBytesAndShardMap) {
  // The greedy sharding reproducing Transformers' map shows the parameter order is its named_parameters() order.
  for (const char* variant : {"yarn_window_aux", "tied_mqa_default_rope"}) {
    SCOPED_TRACE(variant);
    test::expect_convert_reproduces(kFixtures / variant / "ckpt", std::string("gpt_oss_") + variant);
  }
}

// `convert` of the MXFP4 checkpoint writes the dequantised bf16 model under the bf16 names, without
// quantization_config, and loads back to the same weights.
TEST(GptOssFamily, ConvertDequantisesMxfp4) {
  const fs::path dir = kFixtures / "yarn_window_aux";
  const fs::path out = fs::temp_directory_path() / "mt_gpt_oss_mxfp4_convert";
  fs::remove_all(out);
  CausalLM::from_pretrained((dir / "ckpt_mxfp4").string()).save_pretrained(out.string());
  const nlohmann::json cfg = read_json(out / "config.json");
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_EQ(cfg["dtype"], "bfloat16");
  // The bf16 checkpoint it wrote converts to itself byte for byte (shards, index, config).
  const fs::path again = out.string() + "_again";
  fs::remove_all(again);
  CausalLM::from_pretrained(out.string()).save_pretrained(again.string());
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(again / name));
    EXPECT_TRUE(test::read_bytes(e.path()) == test::read_bytes(again / name));
  }
  fs::remove_all(again);
  const SafetensorsFile hf = SafetensorsFile::open((dir / "ckpt_mxfp4_hf_loaded.safetensors").string());
  const SafetensorsFile saved = SafetensorsFile::open((out / "model.safetensors").string());
  EXPECT_EQ(saved.names().size(), hf.names().size());
  for (const std::string& n : hf.names()) {
    SCOPED_TRACE(n);
    const Tensor a = saved.tensor(n), b = hf.tensor(n);
    EXPECT_EQ(a.dtype(), DType::BF16);
    EXPECT_EQ(a.shape(), b.shape());
    EXPECT_TRUE(a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
  }
  fs::remove_all(out);
}

// The hub sizes (OpenAI's model card: gpt-oss-20b 20.91B total / 3.61B active, gpt-oss-120b 116.83B / 5.13B;
// its active count includes the unembedding but not the embedding).
TEST(GptOssFamily, PresetsHaveTheHubSizes) {
  struct Want {
    const char* preset;
    double total, active;
  };
  for (const Want& w : {Want{"gpt-oss-20b", 20.91e9, 3.61e9}, Want{"gpt-oss-120b", 116.83e9, 5.13e9}}) {
    SCOPED_TRACE(w.preset);
    const DecoderSpec s = DecoderSpec::from_json(preset_config_json(w.preset), w.preset);
    const ParamCounts c = param_counts(param_table_of(s));
    const double embed = static_cast<double>(s.vocab_size * s.hidden_size);
    EXPECT_NEAR(static_cast<double>(c.total), w.total, 0.005e9);
    EXPECT_NEAR(static_cast<double>(c.active) - embed, w.active, 0.005e9);
  }
}

// `--layers N` (init, bench) keeps a preset valid: layer_types cut (or left to the default), mlp_only_layers past N
// dropped.
TEST(GptOssFamily, LayerOverrideKeepsPerLayerListsValid) {
  nlohmann::json j = preset_config_json("gpt-oss-20b");
  config_json_set_layers(j, 3);
  const DecoderSpec s = DecoderSpec::from_json(j, "preset");
  ASSERT_EQ(s.num_layers(), 3);
  EXPECT_EQ(s.attention_of(0)->sliding_window, 128);
  EXPECT_EQ(s.attention_of(1)->sliding_window, 0);
  EXPECT_EQ(s.attention_of(2)->sliding_window, 128);
  config_json_set_layers(j, 5);  // more than listed: GPT-OSS's default alternation
  EXPECT_EQ(DecoderSpec::from_json(j, "preset").attention_of(4)->sliding_window, 128);
  nlohmann::json q = preset_config_json("qwen3-moe-test");
  q["mlp_only_layers"] = {0, 1};
  config_json_set_layers(q, 1);
  EXPECT_EQ(q["mlp_only_layers"], nlohmann::json({0}));
  EXPECT_FALSE(DecoderSpec::from_json(q, "preset").is_moe_layer(0));
}

}  // namespace
}  // namespace mt
