// DeepSeek-V3 as a family (issue 40): config.json -> spec (v5 and hub spellings, Transformers' quirks), the spec
// back to config.json, the parameter table, loading the Transformers-made fixture checkpoints
// (tests/fixtures/deepseek_v3: fp32 and FP8) into the engines' layout, MTP layers dropped, `convert` writing what
// Transformers writes, the presets' sizes. The model math is in deepseek_v3_parity_test.cpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/checkpoint_files.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/decoder_costs.h"
#include "models/param_table.h"
#include "models/presets.h"
#include "models/registry.h"
#include "hf_fixture_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using test::read_json;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/deepseek_v3";

DecoderSpec spec_of(const char* variant) {
  return DecoderSpec::from_file((kFixtures / variant / "ckpt" / "config.json").string());
}

double mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

TEST(DeepseekV3Family, ParsesTheV5FixtureConfig) {
  const DecoderSpec s = spec_of("mla_yarn_dense1");
  EXPECT_EQ(s.architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(s.model_type, "deepseek_v3");
  EXPECT_EQ(s.norm_rounding, NormRounding::qwen);
  EXPECT_EQ(s.num_layers(), 2);
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-6);
  EXPECT_FALSE(s.padding_idx.has_value());  // pad_token_id null
  const AttentionSpec& a = *s.attention_of(0);
  EXPECT_EQ(a.kind, AttentionKind::mla);
  EXPECT_EQ(a.heads, 4);
  EXPECT_EQ(a.kv_heads, 4);
  EXPECT_EQ(a.q_lora_rank, 16);
  EXPECT_EQ(a.kv_lora_rank, 16);
  EXPECT_EQ(a.qk_nope_head_dim, 24);
  EXPECT_EQ(a.qk_rope_head_dim, 8);
  EXPECT_EQ(a.head_dim, 32);  // qk_head_dim; config.json's head_dim 8 is qk_rope_head_dim
  EXPECT_EQ(a.value_dim(), 16);
  EXPECT_EQ(a.rope.kind, RopeKind::yarn);
  EXPECT_TRUE(a.rope.interleaved);
  EXPECT_EQ(a.rope.rotary_dim, 8);
  EXPECT_DOUBLE_EQ(a.rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(a.rope.factor, 40.0);
  EXPECT_EQ(a.rope.original_max_position, 4096);
  EXPECT_TRUE(a.rope.truncate);
  EXPECT_DOUBLE_EQ(a.rope.attention_factor, 1.0);  // mscale == mscale_all_dim
  // hf-numerics.md §5.2: 32^-1/2 · (0.1·ln 40 + 1)².
  EXPECT_DOUBLE_EQ(a.scale, std::pow(32.0, -0.5) * mscale(40, 1) * mscale(40, 1));
  EXPECT_FALSE(s.is_moe_layer(0));  // first_k_dense_replace 1
  ASSERT_TRUE(s.is_moe_layer(1));
  EXPECT_EQ(s.mlp_of(0)->intermediate_size, 48);
  const MoeSpec& m = *s.moe_of(1);
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_EQ(m.expert.intermediate_size, 16);
  EXPECT_EQ(m.router.score, RouterScore::sigmoid_group);
  EXPECT_TRUE(m.router.correction_bias && m.router.norm_topk_prob);
  EXPECT_EQ(m.router.groups, 4);
  EXPECT_EQ(m.router.topk_groups, 2);
  EXPECT_DOUBLE_EQ(m.router.scale, 2.5);
  ASSERT_TRUE(m.shared_expert.has_value());
  EXPECT_EQ(m.shared_expert->intermediate_size, 16);
  EXPECT_FALSE(m.aux_loss_on);
  EXPECT_FALSE(s.aux_loss_on());
}

TEST(DeepseekV3Family, ParsesTheHubSpellings) {
  const DecoderSpec s = spec_of("plain_q_legacy_config");
  const AttentionSpec& a = *s.attention_of(0);
  EXPECT_EQ(a.q_lora_rank, 0);  // q_lora_rank null: a plain q_proj
  EXPECT_EQ(a.rope.kind, RopeKind::yarn);  // rope_scaling {"type": "yarn"}
  EXPECT_DOUBLE_EQ(a.rope.factor, 4.0);
  // mscale 1 ≠ mscale_all_dim 0.8: cos/sin scaled by their ratio, the softmax by mscale(4, 0.8)².
  EXPECT_DOUBLE_EQ(a.rope.attention_factor, mscale(4, 1.0) / mscale(4, 0.8));
  EXPECT_DOUBLE_EQ(a.scale, std::pow(32.0, -0.5) * mscale(4, 0.8) * mscale(4, 0.8));
  EXPECT_EQ(s.dtype, DType::F32);  // torch_dtype
  EXPECT_TRUE(s.is_moe_layer(0) && s.is_moe_layer(1));  // first_k_dense_replace 0
  const MoeSpec& m = *s.moe_of(0);
  EXPECT_EQ(m.router.groups, 1);
  EXPECT_EQ(m.experts_per_token, 3);
  EXPECT_FALSE(m.router.norm_topk_prob);
  EXPECT_DOUBLE_EQ(m.router.scale, 1.5);
  EXPECT_EQ(m.shared_expert->intermediate_size, 32);  // 2 shared experts of 16
}

// What a v5 save_pretrained writes: to_json of the v5 fixture gives its config.json back, and the hub spellings
// come back in v5 spellings that parse to the same model.
TEST(DeepseekV3Family, ToJsonWritesTheV5Config) {
  const nlohmann::json v5 = read_json(kFixtures / "mla_yarn_dense1" / "ckpt" / "config.json");
  EXPECT_EQ(spec_of("mla_yarn_dense1").to_json(), v5);

  const DecoderSpec legacy = spec_of("plain_q_legacy_config");
  const nlohmann::json out = legacy.to_json();
  for (const char* gone : {"rope_scaling", "rope_theta", "torch_dtype", "num_mtp_layers", "num_local_experts"})
    EXPECT_FALSE(out.contains(gone)) << gone;
  EXPECT_EQ(out["dtype"], "float32");
  EXPECT_EQ(out["rope_parameters"]["rope_type"], "yarn");
  EXPECT_FALSE(out["rope_parameters"].contains("type"));
  EXPECT_EQ(out["rope_parameters"]["rope_theta"], 10000.0);
  EXPECT_EQ(out["rope_parameters"]["mscale_all_dim"], 0.8);
  EXPECT_EQ(out["head_dim"], 8);
  EXPECT_EQ(out["qk_head_dim"], 32);
  EXPECT_TRUE(out["q_lora_rank"].is_null());
  EXPECT_EQ(out["num_nextn_predict_layers"], 1);
  const DecoderSpec back = DecoderSpec::from_json(out, "config.json");
  const AttentionSpec &a = *back.attention_of(0), &b = *legacy.attention_of(0);
  EXPECT_EQ(a.rope, b.rope);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(back.moe_of(1)->shared_expert->intermediate_size, legacy.moe_of(1)->shared_expert->intermediate_size);
  EXPECT_EQ(back.to_json(), out);
}

// DeepseekV3Config's defaults (the V3 shapes) when fields are absent.
TEST(DeepseekV3Family, DefaultsAreDeepseekV3Config) {
  const nlohmann::json j = {{"architectures", {"DeepseekV3ForCausalLM"}}, {"num_hidden_layers", 4}};
  const DecoderSpec s = DecoderSpec::from_json(j, "config.json");
  EXPECT_EQ(s.hidden_size, 7168);
  EXPECT_EQ(s.vocab_size, 129280);
  const AttentionSpec& a = *s.attention_of(0);
  EXPECT_EQ(a.heads, 128);
  EXPECT_EQ(a.q_lora_rank, 1536);
  EXPECT_EQ(a.kv_lora_rank, 512);
  EXPECT_EQ(a.head_dim, 192);
  EXPECT_EQ(a.value_dim(), 128);
  EXPECT_EQ(a.rope.kind, RopeKind::standard);
  EXPECT_DOUBLE_EQ(a.scale, std::pow(192.0, -0.5));
  EXPECT_FALSE(s.is_moe_layer(2));
  EXPECT_TRUE(s.is_moe_layer(3));  // first_k_dense_replace 3
  EXPECT_EQ(s.num_experts(), 256);
  EXPECT_EQ(s.experts_per_token(), 8);
  EXPECT_EQ(s.moe_of(3)->router.groups, 8);
  EXPECT_EQ(s.moe_of(3)->router.topk_groups, 4);
}

TEST(DeepseekV3Family, HostileConfigsNameTheField) {
  const nlohmann::json base = read_json(kFixtures / "mla_yarn_dense1" / "ckpt" / "config.json");
  auto expect_bad = [&](const char* field, const nlohmann::json& value, const char* fragment) {
    nlohmann::json j = base;
    if (value.is_discarded())
      j.erase(field);
    else
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
  expect_bad("num_key_value_heads", 2, "field 'num_key_value_heads'");
  expect_bad("qk_rope_head_dim", 7, "field 'qk_rope_head_dim'");
  expect_bad("qk_rope_head_dim", -8, "field 'qk_rope_head_dim'");
  expect_bad("q_lora_rank", 0, "field 'q_lora_rank'");
  expect_bad("q_lora_rank", "16", "field 'q_lora_rank'");
  expect_bad("kv_lora_rank", nullptr, "field 'kv_lora_rank'");
  expect_bad("v_head_dim", 0, "field 'v_head_dim'");
  expect_bad("n_group", 3, "field 'n_group'");   // 8 experts do not split into 3 groups
  expect_bad("n_group", 8, "field 'n_group'");   // groups of one expert: no top-2 per group
  expect_bad("n_group", 0, "field 'n_group'");
  expect_bad("topk_group", 5, "field 'topk_group'");
  expect_bad("num_experts_per_tok", 5, "field 'num_experts_per_tok'");  // 2 groups of 2 reachable
  const nlohmann::json absent(nlohmann::json::value_t::discarded);
  expect_bad("num_experts_per_tok", absent, "8 (the default)");  // V3's top-8 does not fit 4 reachable experts
  expect_bad("n_group", absent, "8 (the default)");              // 8 groups of 1 expert
  expect_bad("n_shared_experts", 0, "field 'n_shared_experts'");
  expect_bad("first_k_dense_replace", -1, "field 'first_k_dense_replace'");
  expect_bad("first_k_dense_replace", nullptr, "field 'first_k_dense_replace'");
  expect_bad("routed_scaling_factor", -1.0, "field 'routed_scaling_factor'");
  expect_bad("norm_topk_prob", 1, "field 'norm_topk_prob'");
  expect_bad("rope_interleave", "yes", "field 'rope_interleave'");
  expect_bad("attention_bias", true, "field 'attention_bias'");
  expect_bad("attention_dropout", 0.1, "field 'attention_dropout'");
  expect_bad("hidden_act", "gelu", "field 'hidden_act'");
  expect_bad("scoring_func", "softmax", "field 'scoring_func'");
  expect_bad("topk_method", "greedy", "field 'topk_method'");
  expect_bad("moe_layer_freq", 2, "field 'moe_layer_freq'");
  expect_bad("num_nextn_predict_layers", -1, "field 'num_nextn_predict_layers'");
  expect_bad("n_routed_experts", 0, "field 'n_routed_experts'");
  expect_bad("num_local_experts", 16, "field 'num_local_experts'");  // disagrees with n_routed_experts
  expect_bad("pad_token_id", 128, "field 'pad_token_id'");
  expect_bad("hidden_size", int64_t{1} << 32, "field 'hidden_size'");
  expect_bad("n_routed_experts", int64_t{1} << 31, "field 'n_routed_experts'");  // [E, 2I, H] past 2^40 elements
  expect_bad("rope_parameters", {{"rope_type", "longrope"}}, "field 'rope_parameters.rope_type'");
  expect_bad("rope_parameters", {{"rope_type", "yarn"}, {"factor", -2}}, "field 'rope_parameters.factor'");
  expect_bad("rope_parameters", {{"rope_type", "yarn"}, {"mscale_all_dim", 1.0}}, "field 'rope_parameters.factor'");
  expect_bad("rope_parameters", {{"rope_type", "yarn"}, {"factor", 4}, {"rope_theta", 1.0}},
             "field 'rope_parameters.rope_theta'");
  expect_bad("rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}},
             "field 'rope_parameters.partial_rotary_factor'");
  expect_bad("rope_parameters", "yarn", "field 'rope_parameters'");
  expect_bad("quantization_config", {{"quant_method", "mxfp4"}}, "field 'quantization_config.quant_method'");
  expect_bad("model_type", "deepseek_v2", "field 'model_type'");
}

// The order, names and shapes of Transformers' named_parameters() (the buffer after its module's parameter, as in
// state_dict), and its num_parameters() (buffers excluded).
TEST(DeepseekV3Family, ParameterTableFollowsTransformers) {
  const DecoderSpec s = spec_of("mla_yarn_dense1");
  const ParamTable t = param_table_of(s);
  std::vector<std::string> names;
  for (const ParamEntry& e : t.entries()) names.push_back(e.name);
  const std::string a0 = "model.layers.0.self_attn.", a1 = "model.layers.1.self_attn.";
  const std::vector<std::string> want = {
      "model.embed_tokens.weight",
      a0 + "q_a_proj.weight", a0 + "q_a_layernorm.weight", a0 + "q_b_proj.weight", a0 + "kv_a_proj_with_mqa.weight",
      a0 + "kv_a_layernorm.weight", a0 + "kv_b_proj.weight", a0 + "o_proj.weight",
      "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
      "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
      a1 + "q_a_proj.weight", a1 + "q_a_layernorm.weight", a1 + "q_b_proj.weight", a1 + "kv_a_proj_with_mqa.weight",
      a1 + "kv_a_layernorm.weight", a1 + "kv_b_proj.weight", a1 + "o_proj.weight",
      "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
      "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
      "model.layers.1.mlp.shared_experts.gate_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
      "model.layers.1.mlp.shared_experts.down_proj.weight",
      "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
      "model.norm.weight", "lm_head.weight"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(t.find(a0 + "q_b_proj.weight")->shape, (Shape{4 * 32, 16}));
  EXPECT_EQ(t.find(a0 + "kv_a_proj_with_mqa.weight")->shape, (Shape{16 + 8, 32}));
  EXPECT_EQ(t.find(a0 + "kv_b_proj.weight")->shape, (Shape{4 * (24 + 16), 16}));
  EXPECT_EQ(t.find(a0 + "o_proj.weight")->shape, (Shape{32, 4 * 16}));
  EXPECT_EQ(t.find("model.layers.1.mlp.experts.gate_up_proj")->shape, (Shape{8, 32, 32}));
  const ParamEntry& bias = *t.find("model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(bias.role, ParamRole::buffer);
  EXPECT_EQ(bias.dtype, ParamDType::f32);
  EXPECT_FALSE(bias.trainable);
  EXPECT_EQ(bias.init, ParamInit::zeros);
  EXPECT_TRUE(t.find(a0 + "q_a_layernorm.weight")->use == ParamUse::norm);
  EXPECT_EQ(param_counts(t).total, read_json(kFixtures / "mla_yarn_dense1" / "meta.json")["hf"]["parameters"]);
  const ParamTable plain = param_table_of(spec_of("plain_q_legacy_config"));
  EXPECT_NE(plain.find(a0 + "q_proj.weight"), nullptr);
  EXPECT_EQ(plain.find(a0 + "q_a_proj.weight"), nullptr);
  EXPECT_EQ(param_counts(plain).total,
            read_json(kFixtures / "plain_q_legacy_config" / "meta.json")["hf"]["parameters"]);
  // named_parameters() leaves the buffer out; a bf16 model keeps it F32.
  const CausalLM m = CausalLM::from_config(spec_of("mla_yarn_dense1"), DType::BF16, 3);
  EXPECT_EQ(m.weights.named_parameters().size(), names.size() - 1);
  EXPECT_EQ(m.weights.layers[1].router_score_bias.dtype(), DType::F32);
  EXPECT_EQ(m.weights.layers[1].router_score_bias.to_floats(), std::vector<float>(8, 0.0f));
  EXPECT_EQ(m.weights.layers[1].q_a_norm.to_floats(), std::vector<float>(16, 1.0f));
}

// Every tensor of the checkpoint in memory as Transformers holds it: the per-expert stack concatenated (gate rows,
// then up rows), the rest under its own name, the buffer F32.
TEST(DeepseekV3Family, LoadsTheFp32CheckpointInTheEngineLayout) {
  for (const char* variant : {"mla_yarn_dense1", "plain_q_legacy_config"}) {
    SCOPED_TRACE(variant);
    const fs::path dir = kFixtures / variant / "ckpt";
    const CausalLM m = CausalLM::from_pretrained(dir.string());
    EXPECT_EQ(m.dtype, DType::F32);
    const CheckpointFiles files = CheckpointFiles::open(dir.string());
    std::map<std::string, std::vector<float>> stored;
    for (const std::string& n : files.names()) stored[n] = files.tensor(n).to_floats();
    const ParamTable& t = m.weights.param_table();
    for (const ParamEntry& e : t.entries()) {
      SCOPED_TRACE(e.name);
      const std::vector<float> got = m.weights.slot(e).to_floats();
      if (e.role != ParamRole::expert_stack) {
        EXPECT_EQ(got, stored.at(e.name));
        continue;
      }
      const bool gate_up = e.name.find("gate_up_proj") != std::string::npos;
      const int64_t E = e.shape[0], rows = e.shape[1], cols = e.shape[2];
      const std::string prefix = e.name.substr(0, e.name.rfind('.') + 1);  // "...mlp.experts."
      for (int64_t x = 0; x < E; ++x)
        for (int64_t r = 0; r < rows; ++r) {
          std::string src = prefix + std::to_string(x) + ".down_proj.weight";
          int64_t sr = r;
          if (gate_up) {
            src = prefix + std::to_string(x) + (r < rows / 2 ? ".gate_proj.weight" : ".up_proj.weight");
            sr = r % (rows / 2);
          }
          const std::vector<float>& w = stored.at(src);
          for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(got[(x * rows + r) * cols + c], w[sr * cols + c]);
        }
    }
    EXPECT_EQ(m.weights.layers[1].router_score_bias.dtype(), DType::F32);
  }
}

// hf-numerics.md §5.1: the MTP module stored after the decoder layers (num_nextn_predict_layers 1: layer 2 here) and
// anything under Transformers' literal model.layers.61 are dropped on load, as DeepseekV3ForCausalLM ignores them.
TEST(DeepseekV3Family, MtpLayersAreDroppedOnLoad) {
  const fs::path dir = kFixtures / "mla_yarn_dense1" / "ckpt";
  const DecoderSpec spec = spec_of("mla_yarn_dense1");
  const CheckpointFiles files = CheckpointFiles::open(dir.string());
  std::map<std::string, Tensor> tensors;
  for (const std::string& n : files.names()) tensors[n] = files.tensor(n);
  for (const char* extra : {"model.layers.2.self_attn.q_a_proj.weight", "model.layers.2.enorm.weight",
                            "model.layers.2.shared_head.head.weight", "model.layers.61.eh_proj.weight"})
    tensors[extra] = Tensor::zeros({2, 2}, DType::F32);
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors) names.push_back(n);
  auto lookup = [&](const std::string& n) { return tensors.at(n); };
  const ModelWeights w = ModelWeights::from_hf(spec, DType::F32, lookup, names, "ckpt");
  EXPECT_EQ(w.layers[0].q_a_proj.to_floats(), files.tensor("model.layers.0.self_attn.q_a_proj.weight").to_floats());
  // Without the MTP layer in the config, layer 2's tensors are unexpected.
  nlohmann::json j = spec.raw;
  j["num_nextn_predict_layers"] = 0;
  const DecoderSpec no_mtp = DecoderSpec::from_json(j, "config.json");
  try {
    ModelWeights::from_hf(no_mtp, DType::F32, lookup, names, "ckpt");
    ADD_FAILURE() << "layer 2 accepted without an MTP layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2."), std::string::npos) << e.what();
  }
}

// hf-numerics.md §8.6 with ceil-sized edge blocks: the FP8 checkpoint loads to the correct dequantisation (the
// generator's ckpt_fp8_dequantized, bit for bit in bf16). Transformers 5.17 itself derives kv_b_proj's block as
// rows // scale_rows (160 // 2 = 80) and loads a different kv_b_proj (ckpt_fp8_hf_loaded); every other tensor is
// what it loads, bit for bit.
TEST(DeepseekV3Family, Fp8CheckpointLoadsToTheCeilBlockDequantisation) {
  const fs::path dir = kFixtures / "mla_yarn_dense1";
  const CausalLM m = CausalLM::from_pretrained((dir / "ckpt_fp8").string());
  EXPECT_EQ(m.dtype, DType::BF16);
  const SafetensorsFile correct = SafetensorsFile::open((dir / "ckpt_fp8_dequantized.safetensors").string());
  const SafetensorsFile hf = SafetensorsFile::open((dir / "ckpt_fp8_hf_loaded.safetensors").string());
  const ParamTable& t = m.weights.param_table();
  EXPECT_EQ(correct.names().size(), t.entries().size());
  for (const ParamEntry& e : t.entries()) {
    SCOPED_TRACE(e.name);
    const Tensor& got = m.weights.slot(e);
    const Tensor want = correct.tensor(e.name);
    ASSERT_EQ(got.dtype(), want.dtype());
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0);
    const bool hf_misreads = e.name.find("kv_b_proj") != std::string::npos;
    EXPECT_EQ(got.to_floats() == hf.tensor(e.name).to_floats(), !hf_misreads);
  }
}

TEST(DeepseekV3Family, ConvertRewritesTheSameBytesAndShardMap) {
  for (const char* variant : {"mla_yarn_dense1", "plain_q_legacy_config"}) {
    SCOPED_TRACE(variant);
    test::expect_convert_reproduces(kFixtures / variant / "ckpt", std::string("dsv3_") + variant);
  }
  test::expect_convert_reproduces(kFixtures / "train5" / "final", "dsv3_train5");
}

// `convert` of the FP8 checkpoint writes the dequantised bf16 model (the F32 buffer first in the shard, §8.3) without
// quantization_config; that bf16 checkpoint converts to itself byte for byte.
TEST(DeepseekV3Family, ConvertDequantisesFp8AndRoundTripsBf16) {
  const fs::path dir = kFixtures / "mla_yarn_dense1";
  const fs::path out = fs::temp_directory_path() / "mt_dsv3_fp8_convert";
  fs::remove_all(out);
  CausalLM::from_pretrained((dir / "ckpt_fp8").string()).save_pretrained(out.string());
  const nlohmann::json cfg = read_json(out / "config.json");
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_EQ(cfg["dtype"], "bfloat16");
  const SafetensorsFile saved = SafetensorsFile::open((out / "model.safetensors").string());
  ASSERT_FALSE(saved.names().empty());
  EXPECT_EQ(saved.names()[0], "model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(saved.info(saved.names()[0]).dtype, DType::F32);
  for (size_t i = 1; i < saved.names().size(); ++i) EXPECT_EQ(saved.info(saved.names()[i]).dtype, DType::BF16);
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
  fs::remove_all(out);
}

// The hub sizes: DeepSeek-V3 671B total / 37B activated (its model card, MTP excluded), Moonlight-16B-A3B ~16B / ~3B.
// Their FLOPs and memory plan terms exist (bench --plan-only, inspect).
TEST(DeepseekV3Family, PresetsHaveTheHubSizes) {
  struct Want {
    const char* preset;
    double total, active, tol;
  };
  for (const Want& w : {Want{"deepseek-v3", 671e9, 37e9, 1e9}, Want{"moonlight-16b-a3b", 16e9, 3e9, 0.2e9}}) {
    SCOPED_TRACE(w.preset);
    const DecoderSpec s = DecoderSpec::from_json(preset_config_json(w.preset), w.preset);
    const ParamCounts c = param_counts(param_table_of(s));
    EXPECT_NEAR(static_cast<double>(c.total), w.total, w.tol);
    EXPECT_NEAR(static_cast<double>(c.active), w.active, w.tol);
    EXPECT_GT(decoder_flops_per_token(s, 4096), 2.0 * static_cast<double>(c.active - s.vocab_size * s.hidden_size));
  }
  const DecoderSpec moon = DecoderSpec::from_json(preset_config_json("moonlight-16b-a3b"), "moonlight");
  EXPECT_EQ(moon.attention_of(0)->q_lora_rank, 0);
  EXPECT_EQ(moon.attention_of(0)->rope.kind, RopeKind::standard);
  EXPECT_DOUBLE_EQ(moon.attention_of(0)->rope.theta, 50000.0);
  EXPECT_FALSE(moon.is_moe_layer(0));
  EXPECT_TRUE(moon.is_moe_layer(1));
}

}  // namespace
}  // namespace mt
