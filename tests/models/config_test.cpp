#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "models/registry.h"
#include "models/spec/decoder_spec.h"

namespace mt {
namespace {

using nlohmann::json;

// Qwen3-30B-A3B config.json as published on the hub (hf-numerics.md §3.1).
json qwen3_30b_a3b() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
  })");
}

json tiny_moe() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 24, "moe_intermediate_size": 8, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
    "dtype": "float32", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
  })");
}

json tiny_dense() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8
  })");
}

// Parsing `j` must fail with a one-line message naming the file and `field`.
void expect_field_error(const json& j, const std::string& field, const std::string& also = "") {
  try {
    DecoderSpec::from_json(j, "cfg/config.json");
    ADD_FAILURE() << "no error for field " << field << " in " << j.dump();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("cfg/config.json: ", 0), 0u) << m;
    EXPECT_NE(m.find("field '" + field + "'"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    if (!also.empty()) {
      EXPECT_NE(m.find(also), std::string::npos) << m;
    }
  }
}

TEST(Qwen3FamilyConfig, Qwen3_30B_A3B) {
  DecoderSpec c = DecoderSpec::from_json(qwen3_30b_a3b(), "config.json");
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.only_attention().head_dim, 128);  // declared, not 2048 / 32
  EXPECT_EQ(c.only_attention().heads, 32);
  EXPECT_EQ(c.only_attention().kv_heads, 4);
  EXPECT_EQ(c.num_experts(), 128);
  EXPECT_EQ(c.experts_per_token(), 8);
  EXPECT_EQ(c.only_moe().expert.intermediate_size, 768);
  EXPECT_EQ(c.only_mlp().intermediate_size, 6144);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c.only_attention().rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-6);
  EXPECT_TRUE(c.only_moe().router.norm_topk_prob);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::BF16);
  int moe_layers = 0;
  for (int64_t i = 0; i < c.num_layers(); ++i) moe_layers += c.is_moe_layer(i);
  EXPECT_EQ(moe_layers, 48);
}

TEST(Qwen3FamilyConfig, DefaultsOfV5) {
  json j = tiny_moe();
  for (const char* k : {"num_key_value_heads", "head_dim", "dtype", "rope_parameters", "intermediate_size"}) j.erase(k);
  DecoderSpec c = DecoderSpec::from_json(j, "c.json");
  EXPECT_EQ(c.only_attention().kv_heads, 4);  // Transformers Qwen3-MoE class default
  EXPECT_EQ(c.only_attention().head_dim, 16 / 4);
  EXPECT_EQ(c.dtype, DType::F32);
  EXPECT_DOUBLE_EQ(c.only_attention().rope.theta, 10000.0);
  EXPECT_EQ(c.only_mlp().intermediate_size, 6144);  // unused: every layer is MoE
  for (int64_t l = 0; l < c.num_layers(); ++l) EXPECT_TRUE(c.is_moe_layer(l));  // decoder_sparse_step 1
  EXPECT_FALSE(c.only_moe().router.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.only_moe().aux_loss_coef, 0.001);
  EXPECT_DOUBLE_EQ(c.initializer_range, 0.02);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  // head_dim null also falls back; num_key_value_heads null means "= heads".
  j["head_dim"] = nullptr;
  j["num_key_value_heads"] = nullptr;
  c = DecoderSpec::from_json(j, "c.json");
  EXPECT_EQ(c.only_attention().head_dim, 4);
  EXPECT_EQ(c.only_attention().kv_heads, 4);
}

TEST(Qwen3FamilyConfig, BothSpellings) {
  json legacy = tiny_moe();
  legacy.erase("num_local_experts");
  legacy["num_experts"] = 4;
  legacy.erase("dtype");
  legacy["torch_dtype"] = "bfloat16";
  legacy.erase("rope_parameters");
  legacy["rope_theta"] = 1e6;
  legacy["rope_scaling"] = nullptr;
  DecoderSpec a = DecoderSpec::from_json(legacy, "a.json");
  EXPECT_EQ(a.num_experts(), 4);
  EXPECT_EQ(a.dtype, DType::BF16);
  EXPECT_DOUBLE_EQ(a.only_attention().rope.theta, 1e6);

  json v5 = tiny_moe();
  v5["dtype"] = "bfloat16";
  v5["rope_parameters"]["rope_theta"] = 1e6;
  DecoderSpec b = DecoderSpec::from_json(v5, "b.json");
  EXPECT_EQ(b.num_experts(), 4);
  EXPECT_EQ(b.dtype, DType::BF16);
  EXPECT_DOUBLE_EQ(b.only_attention().rope.theta, 1e6);

  // Both expert counts present and equal is fine; rope_scaling with `type: default` too.
  json both = legacy;
  both["num_local_experts"] = 4;
  both["rope_scaling"] = {{"type", "default"}};
  EXPECT_EQ(DecoderSpec::from_json(both, "c.json").num_experts(), 4);
  both["num_local_experts"] = 5;
  expect_field_error(both, "num_local_experts", "disagrees");
  // dtype wins over torch_dtype; "torch.float16" spelling is accepted.
  json d = tiny_moe();
  d["dtype"] = "torch.float16";
  d["torch_dtype"] = "bfloat16";
  EXPECT_EQ(DecoderSpec::from_json(d, "d.json").dtype, DType::F16);
}

TEST(Qwen3FamilyConfig, DenseQwen3) {
  DecoderSpec c = DecoderSpec::from_json(tiny_dense(), "d.json");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.num_experts(), 0);
  EXPECT_EQ(c.num_experts(), 0);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));
  // Expert fields in a dense config are ignored (Qwen3Config has none).
  json j = tiny_dense();
  j["num_experts"] = 8;
  EXPECT_EQ(DecoderSpec::from_json(j, "d.json").num_experts(), 0);
  // Qwen3Config declares head_dim = 128 and num_key_value_heads = heads when null.
  j.erase("head_dim");
  EXPECT_EQ(DecoderSpec::from_json(j, "d.json").only_attention().head_dim, 128);
  j["head_dim"] = nullptr;
  EXPECT_EQ(DecoderSpec::from_json(j, "d.json").only_attention().head_dim, 4);
  j = tiny_dense();
  j.erase("intermediate_size");
  expect_field_error(j, "intermediate_size", "missing");
}

TEST(Qwen3FamilyConfig, MoeLayerPattern) {
  json j = tiny_moe();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  DecoderSpec c = DecoderSpec::from_json(j, "c.json");
  // MoE iff i not in mlp_only_layers and (i + 1) % 2 == 0: layers 1 and 5 (3 is forced dense).
  std::vector<bool> expect = {false, true, false, false, false, true};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(c.is_moe_layer(i), expect[i]) << i;
  // With a dense layer, intermediate_size is required.
  j.erase("intermediate_size");
  expect_field_error(j, "intermediate_size", "missing");
  j = tiny_moe();
  j["mlp_only_layers"] = {0, 2};
  c = DecoderSpec::from_json(j, "c.json");
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
}

TEST(Qwen3FamilyConfig, RequiredFields) {
  for (const char* f : {"architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "num_experts_per_tok", "moe_intermediate_size"}) {
    json j = tiny_moe();
    j.erase(f);
    expect_field_error(j, f, "required field is missing");
  }
  json j = tiny_moe();
  j.erase("num_local_experts");
  expect_field_error(j, "num_experts", "num_local_experts");
}

TEST(Qwen3FamilyConfig, TypeErrors) {
  const std::vector<std::pair<json, std::string>> bad_ints = {
      {"16", "string \"16\""}, {16.0, "16"}, {16.5, "16.5"}, {true, "true"}, {-16, "-16"}, {0, "0"},
      {nullptr, "null"}, {json::array({16}), "an array of 1 elements"},
      {json::parse("18446744073709551615"), "18446744073709551615"}};
  for (const auto& [v, found] : bad_ints) {
    json j = tiny_moe();
    j["hidden_size"] = v;
    expect_field_error(j, "hidden_size", "found " + found + ")");
  }
  json j = tiny_moe();
  j["norm_topk_prob"] = 1;
  expect_field_error(j, "norm_topk_prob", "expected true or false");
  j = tiny_moe();
  j["rms_norm_eps"] = "1e-6";
  expect_field_error(j, "rms_norm_eps", "wrong type");
  j = tiny_moe();
  j["mlp_only_layers"] = "0";
  expect_field_error(j, "mlp_only_layers", "wrong type");
  j = tiny_moe();
  j["mlp_only_layers"] = {1.5};
  expect_field_error(j, "mlp_only_layers[0]", "wrong type");
  j = tiny_moe();
  j["dtype"] = 16;
  expect_field_error(j, "dtype", "wrong type");
  j = tiny_moe();
  j["rope_parameters"] = "default";
  expect_field_error(j, "rope_parameters", "wrong type");
  j = tiny_moe();
  j["hidden_act"] = false;
  expect_field_error(j, "hidden_act", "wrong type");
  j = tiny_moe();
  j["model_type"] = 3;
  expect_field_error(j, "model_type", "wrong type");
}

TEST(Qwen3FamilyConfig, ValueErrors) {
  auto with = [](const char* key, json v) {
    json j = tiny_moe();
    j[key] = v;
    return j;
  };
  expect_field_error(with("num_key_value_heads", 3), "num_key_value_heads", "found 3");
  expect_field_error(with("num_experts_per_tok", 5), "num_experts_per_tok", "expected an integer in [1, 4], found 5");
  expect_field_error(with("num_experts_per_tok", 0), "num_experts_per_tok");
  expect_field_error(with("decoder_sparse_step", 0), "decoder_sparse_step");
  expect_field_error(with("mlp_only_layers", {0, 4}), "mlp_only_layers[1]", "expected an integer in [0, 3], found 4");
  expect_field_error(with("mlp_only_layers", {-1}), "mlp_only_layers[0]");
  expect_field_error(with("rms_norm_eps", 0), "rms_norm_eps", "expected a finite number > 0");
  expect_field_error(with("rms_norm_eps", -1e-6), "rms_norm_eps");
  expect_field_error(with("rope_theta", 0.0), "rope_theta");
  expect_field_error(with("rope_parameters", {{"rope_type", "default"}, {"rope_theta", -1}}),
                     "rope_parameters.rope_theta");
  expect_field_error(with("rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}), "rope_parameters.rope_type",
                     "unsupported RoPE type (expected one of: default, found string \"yarn\")");
  expect_field_error(with("rope_scaling", {{"type", "linear"}, {"factor", 2.0}}), "rope_scaling.type");
  expect_field_error(with("rope_scaling", {{"rope_type", "llama3"}}), "rope_scaling.rope_type");
  expect_field_error(with("hidden_act", "gelu"), "hidden_act", "expected \"silu\", found string \"gelu\"");
  expect_field_error(with("use_sliding_window", true), "use_sliding_window", "not supported");
  expect_field_error(with("attention_bias", true), "attention_bias", "not supported");
  expect_field_error(with("dtype", "int8"), "dtype", "unsupported dtype");
  expect_field_error(with("dtype", "float64"), "dtype", "unsupported dtype");
  expect_field_error(with("head_dim", 7), "head_dim", "even");
  expect_field_error(with("num_hidden_layers", 1 << 20), "num_hidden_layers");
  expect_field_error(with("model_type", "qwen3"), "model_type", "expected \"qwen3_moe\"");
  // Sizes that would overflow a tensor's element count.
  json big = tiny_moe();
  big["num_local_experts"] = 1 << 30;
  big["moe_intermediate_size"] = 1 << 30;
  expect_field_error(big, "num_experts", "too large");
  // architectures
  expect_field_error(with("architectures", json::array()), "architectures", "non-empty list");
  expect_field_error(with("architectures", "Qwen3MoeForCausalLM"), "architectures");
  expect_field_error(with("architectures", {7}), "architectures[0]");
  expect_field_error(json::array({1, 2}), "(root)", "expected a JSON object");
}

TEST(Qwen3FamilyConfig, UnknownArchitecture) {
  json j = tiny_moe();
  j["architectures"] = {"LlamaForCausalLM"};
  try {
    DecoderSpec::from_json(j, "m/config.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "m/config.json: architecture 'LlamaForCausalLM' is not supported (supported: DeepseekV3ForCausalLM, "
                 "GptOssForCausalLM, NemotronHForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)");
  }
}

TEST(ArchitectureRegistry, LookupAndList) {
  EXPECT_EQ(architecture_lookup("Qwen3MoeForCausalLM", "f").model_type, "qwen3_moe");
  EXPECT_EQ(architecture_lookup("Qwen3ForCausalLM", "f").model_type, "qwen3");
  EXPECT_EQ(architecture_lookup("GptOssForCausalLM", "f").model_type, "gpt_oss");
  EXPECT_EQ(architecture_lookup("DeepseekV3ForCausalLM", "f").model_type, "deepseek_v3");
  EXPECT_EQ(architecture_lookup("NemotronHForCausalLM", "f").model_type, "nemotron_h");
  ASSERT_EQ(architecture_list().size(), 5u);
  for (const ArchitectureInfo& a : architecture_list()) EXPECT_FALSE(a.description.empty());
  try {
    architecture_lookup(std::string("Bad\nName") + std::string(200, 'x'), "x.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos);
    EXPECT_LT(m.size(), 250u);  // the name cut at 80 characters, then the supported names
    EXPECT_NE(m.find("x.json: architecture 'Bad?Name"), std::string::npos) << m;
  }
}

TEST(Qwen3FamilyConfig, ToJsonKeepsUnknownKeysAndWritesV5) {
  json j = qwen3_30b_a3b();
  j["my_custom_key"] = {{"nested", {1, 2, 3}}};
  DecoderSpec c = DecoderSpec::from_json(j, "c.json");
  json out = c.to_json();
  EXPECT_EQ(out["my_custom_key"], j["my_custom_key"]);
  EXPECT_EQ(out["transformers_version"], "4.51.0");
  EXPECT_EQ(out["bos_token_id"], 151643);
  EXPECT_EQ(out["sliding_window"], nullptr);
  EXPECT_EQ(out["dtype"], "bfloat16");
  EXPECT_FALSE(out.contains("torch_dtype"));
  EXPECT_EQ(out["num_local_experts"], 128);
  EXPECT_FALSE(out.contains("num_experts"));
  EXPECT_FALSE(out.contains("rope_theta"));
  EXPECT_FALSE(out.contains("rope_scaling"));
  EXPECT_EQ(out["rope_parameters"], json({{"rope_type", "default"}, {"rope_theta", 1e6}}));
  EXPECT_EQ(out["architectures"], json({"Qwen3MoeForCausalLM"}));
  // A changed field is written; the result parses back to the same struct.
  c.dtype = DType::F32;
  DecoderSpec back = DecoderSpec::from_json(c.to_json(), "back.json");
  EXPECT_EQ(back.dtype, DType::F32);
  EXPECT_EQ(back.only_attention().head_dim, 128);
  EXPECT_EQ(back.num_experts(), 128);
  EXPECT_DOUBLE_EQ(back.only_attention().rope.theta, 1e6);
  EXPECT_EQ(back.to_json(), c.to_json());
  // Dense: no expert fields appear.
  json d = DecoderSpec::from_json(tiny_dense(), "d.json").to_json();
  EXPECT_FALSE(d.contains("num_local_experts"));
  EXPECT_EQ(d["dtype"], "float32");
}

// pad_token_id is Qwen3(Moe)Model's nn.Embedding padding_idx: absent or null is none; an id in [0, V) is that row;
// a negative one wraps as torch does (Transformers' config only warns: hub configs carry pad_token_id -1); anything
// nn.Embedding refuses, or a non-integer, is a one-line error naming the field.
TEST(Qwen3FamilyConfig, PadTokenIdIsThePaddingIdx) {
  EXPECT_FALSE(DecoderSpec::from_json(qwen3_30b_a3b(), "c.json").padding_idx.has_value());  // absent
  for (json base : {tiny_moe(), tiny_dense()}) {
    json j = base;
    j["pad_token_id"] = nullptr;
    EXPECT_FALSE(DecoderSpec::from_json(j, "c.json").padding_idx.has_value());
    for (int64_t id : {0, 5, 63}) {
      j["pad_token_id"] = id;
      EXPECT_EQ(DecoderSpec::from_json(j, "c.json").padding_idx, std::optional<int64_t>(id));
    }
    j["pad_token_id"] = -1;
    const DecoderSpec wrapped = DecoderSpec::from_json(j, "c.json");
    EXPECT_EQ(wrapped.padding_idx, std::optional<int64_t>(63));
    EXPECT_EQ(wrapped.to_json()["pad_token_id"], -1);  // saved as read
    j["pad_token_id"] = -64;
    EXPECT_EQ(DecoderSpec::from_json(j, "c.json").padding_idx, std::optional<int64_t>(0));
    for (const json& bad : {json(64), json(-65), json(151643), json(18446744073709551615ull)}) {
      j["pad_token_id"] = bad;
      expect_field_error(j, "pad_token_id", "outside the vocabulary");
    }
    for (const json& bad : {json("0"), json(1.0), json(true), json::array({0})}) {
      j["pad_token_id"] = bad;
      expect_field_error(j, "pad_token_id", "wrong type");
    }
  }
  // The spec owns the index: an edited one is written back, and reads back the same.
  json j = tiny_moe();
  j["pad_token_id"] = 5;
  DecoderSpec c = DecoderSpec::from_json(j, "c.json");
  EXPECT_EQ(c.to_json()["pad_token_id"], 5);
  c.padding_idx = 9;
  EXPECT_EQ(c.to_json()["pad_token_id"], 9);
  EXPECT_EQ(DecoderSpec::from_json(c.to_json(), "back.json").padding_idx, std::optional<int64_t>(9));
  c.padding_idx = 64;
  EXPECT_THROW(DecoderSpec::from_json(c.to_json(), "back.json"), Error);
}

TEST(Qwen3FamilyConfig, FromFileFixtures) {
  const std::string dir = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/";
  DecoderSpec a = DecoderSpec::from_file(dir + "moe_gqa_aux/ckpt/config.json");
  EXPECT_EQ(a.num_experts(), 8);
  EXPECT_EQ(a.only_attention().head_dim, 16);
  EXPECT_FALSE(a.is_moe_layer(1));  // mlp_only_layers [1]
  EXPECT_FALSE(a.is_moe_layer(1));
  EXPECT_TRUE(a.is_moe_layer(2));
  EXPECT_DOUBLE_EQ(a.aux_loss_coef(), 0.02);
  EXPECT_TRUE(a.aux_loss_on());
  DecoderSpec b = DecoderSpec::from_file(dir + "moe_mha_tied_sparse2/ckpt/config.json");
  EXPECT_EQ(b.only_attention().head_dim, 8);  // missing: 32 / 4
  EXPECT_EQ(b.num_experts(), 6);
  EXPECT_TRUE(b.tie_word_embeddings);
  EXPECT_FALSE(b.is_moe_layer(0));  // decoder_sparse_step 2
  EXPECT_TRUE(b.is_moe_layer(1));
  DecoderSpec c = DecoderSpec::from_file(dir + "moe_mqa_legacy/ckpt/config.json");  // hub spellings
  EXPECT_EQ(c.num_experts(), 4);
  EXPECT_EQ(c.only_attention().kv_heads, 1);
  EXPECT_EQ(c.experts_per_token(), 4);
  DecoderSpec d = DecoderSpec::from_file(dir + "dense_qwen3/ckpt/config.json");
  EXPECT_EQ(d.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(d.num_experts(), 0);
  EXPECT_TRUE(d.tie_word_embeddings);
  for (const DecoderSpec* s : {&a, &b, &c, &d}) EXPECT_FALSE(s->padding_idx.has_value());  // "pad_token_id": null
}

TEST(Qwen3FamilyConfig, FromFileErrors) {
  const std::string path = testing::TempDir() + "/mixtune_cfg_bad.json";
  {
    std::ofstream f(path);
    f << "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 12";  // truncated
  }
  try {
    DecoderSpec::from_file(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind(path + ": invalid JSON", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  std::remove(path.c_str());
  EXPECT_THROW(DecoderSpec::from_file(path), Error);
}

}  // namespace
}  // namespace mt
