// Nemotron-H as a family (issue 41): config.json -> spec (v5 and hub spellings, Transformers 5.17's quirks), the spec
// back to config.json, the parameter table, loading the Transformers-made fixture checkpoints
// (tests/fixtures/nemotron_h, tools/hf_reference/make_family_fixtures.py --family nemotron_h: `backbone.` names,
// per-expert up/down tensors) into the engines' layout, MTP tensors ignored, `convert` writing what Transformers
// writes, the preset's shapes. The model math is in nemotron_h_parity_test.cpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/float_convert.h"
#include "io/checkpoint_files.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/param_table.h"
#include "models/presets.h"
#include "models/registry.h"
#include "models/spec/config_writer.h"
#include "train/adamw.h"
#include "train/sharded_params.h"
#include "hf_fixture_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::read_json;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/nemotron_h";

DecoderSpec spec_of(const char* variant) {
  return DecoderSpec::from_file((kFixtures / variant / "ckpt" / "config.json").string());
}

std::vector<SublayerKind> kinds_of(const DecoderSpec& s) {
  std::vector<SublayerKind> k;
  for (const LayerSpec& l : s.layers) {
    EXPECT_EQ(l.sublayers.size(), 1u);
    k.push_back(l.sublayers.at(0).kind);
  }
  return k;
}

constexpr SublayerKind M = SublayerKind::mamba2, E = SublayerKind::moe, A = SublayerKind::attention,
                       D = SublayerKind::mlp;

TEST(NemotronHFamily, ParsesTheV5FixtureConfig) {
  const DecoderSpec s = spec_of("hybrid_all_kinds");
  EXPECT_EQ(s.architecture, "NemotronHForCausalLM");
  EXPECT_EQ(s.model_type, "nemotron_h");
  EXPECT_EQ(s.norm_rounding, NormRounding::qwen);
  EXPECT_EQ(kinds_of(s), (std::vector<SublayerKind>{M, E, M, A, E, D}));
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-5);
  EXPECT_FALSE(s.padding_idx.has_value());  // NemotronHModel's nn.Embedding has no padding_idx (pad_token_id 0)
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_EQ(s.dtype, DType::F32);
  const Mamba2Spec& m = *s.mamba2_of(0);
  EXPECT_EQ(m.heads, 4);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.state, 16);
  EXPECT_EQ(m.groups, 2);
  EXPECT_EQ(m.conv_kernel, 4);
  EXPECT_EQ(m.chunk, 8);
  EXPECT_TRUE(m.conv_bias);
  EXPECT_FALSE(m.proj_bias);
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(m.time_step_min, 1e-3);
  EXPECT_EQ(m.inner(), 64);
  EXPECT_EQ(m.conv_dim(), 64 + 2 * 2 * 16);
  EXPECT_EQ(m.in_proj_dim(), 64 + 128 + 4);
  const AttentionSpec& a = *s.attention_of(3);
  EXPECT_EQ(a.kind, AttentionKind::gqa);
  EXPECT_EQ(a.heads, 4);
  EXPECT_EQ(a.kv_heads, 2);
  EXPECT_EQ(a.head_dim, 16);
  EXPECT_EQ(a.rope.kind, RopeKind::none);
  EXPECT_FALSE(a.qk_norm || a.qkv_bias || a.o_bias || a.sinks);
  EXPECT_EQ(s.mlp_of(5)->intermediate_size, 48);
  EXPECT_EQ(s.mlp_of(5)->activation, Activation::relu2);
  const MoeSpec& e = *s.moe_of(1);
  EXPECT_EQ(e.num_experts, 8);
  EXPECT_EQ(e.experts_per_token, 2);
  EXPECT_EQ(e.expert.intermediate_size, 16);
  EXPECT_EQ(e.expert.activation, Activation::relu2);
  EXPECT_EQ(e.router.score, RouterScore::sigmoid_group);
  EXPECT_TRUE(e.router.correction_bias && e.router.norm_topk_prob);
  EXPECT_EQ(e.router.groups, 1);
  EXPECT_DOUBLE_EQ(e.router.scale, 2.5);
  ASSERT_TRUE(e.shared_expert.has_value());
  EXPECT_EQ(e.shared_expert->intermediate_size, 32);
  EXPECT_EQ(e.shared_expert->activation, Activation::relu2);
  EXPECT_FALSE(s.aux_loss_on());
}

TEST(NemotronHFamily, ParsesTheHubSpellings) {
  const DecoderSpec s = spec_of("one_group_dt_clamp_pattern");
  EXPECT_EQ(kinds_of(s), (std::vector<SublayerKind>{A, M, E, M}));  // hybrid_override_pattern "*MEM"
  EXPECT_EQ(s.dtype, DType::F32);                                     // torch_dtype
  EXPECT_EQ(s.mamba2_of(1)->groups, 1);
  EXPECT_DOUBLE_EQ(s.mamba2_of(1)->time_step_min, 0.05);
  EXPECT_EQ(s.moe_of(2)->experts_per_token, 3);
  EXPECT_FALSE(s.moe_of(2)->router.norm_topk_prob);
  EXPECT_DOUBLE_EQ(s.moe_of(2)->router.scale, 1.0);
}

// What a v5 save_pretrained writes: to_json of the v5 fixture gives its config.json back; the hub spellings come back
// in v5 spellings that parse to the same model.
TEST(NemotronHFamily, ToJsonWritesTheV5Config) {
  EXPECT_EQ(spec_of("hybrid_all_kinds").to_json(), read_json(kFixtures / "hybrid_all_kinds" / "ckpt" / "config.json"));
  const DecoderSpec hub = spec_of("one_group_dt_clamp_pattern");
  const json out = hub.to_json();
  for (const char* gone : {"hybrid_override_pattern", "torch_dtype", "num_hidden_layers"})
    EXPECT_FALSE(out.contains(gone)) << gone;
  EXPECT_EQ(out["layers_block_type"], json({"full_attention", "linear_attention", "moe", "linear_attention"}));
  EXPECT_EQ(out["dtype"], "float32");
  EXPECT_EQ(out["rope_theta"], 10000);  // a key the family does not read is carried through
  const DecoderSpec back = DecoderSpec::from_json(out, "config.json");
  EXPECT_EQ(kinds_of(back), kinds_of(hub));
  EXPECT_EQ(back.to_json(), out);
}

// NemotronHConfig.__post_init__: the legacy mamba_* spellings win over the v5 fields, and are saved under the v5
// names; the legacy layer-kind names are read; layers_block_type wins over hybrid_override_pattern; the layer count
// comes from the list whatever num_hidden_layers says; norm_eps stands in for a missing layer_norm_epsilon.
TEST(NemotronHFamily, LegacySpellingsFollowTransformers) {
  json j = read_json(kFixtures / "hybrid_all_kinds" / "ckpt" / "config.json");
  j["mamba_n_groups"] = 4;
  j["mamba_d_conv"] = 3;
  j["mamba_chunk_size"] = 16;
  j["mamba_dt_min"] = 0.01;
  j["mamba_conv_bias"] = false;
  j["mamba_expand"] = 7;
  j["layers_block_type"] = {"mamba", "attention", "moe", "mlp", "linear_attention"};
  j["hybrid_override_pattern"] = "E";
  j["num_hidden_layers"] = 9;
  j.erase("layer_norm_epsilon");
  j["norm_eps"] = 1e-6;
  const DecoderSpec s = DecoderSpec::from_json(j, "config.json");
  EXPECT_EQ(kinds_of(s), (std::vector<SublayerKind>{M, A, E, D, M}));
  const Mamba2Spec& m = *s.mamba2_of(0);
  EXPECT_EQ(m.groups, 4);
  EXPECT_EQ(m.conv_kernel, 3);
  EXPECT_EQ(m.chunk, 16);
  EXPECT_DOUBLE_EQ(m.time_step_min, 0.01);
  EXPECT_FALSE(m.conv_bias);
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-6);
  const json out = s.to_json();
  for (const char* gone : {"mamba_n_groups", "mamba_d_conv", "mamba_chunk_size", "mamba_dt_min", "mamba_conv_bias",
                           "mamba_expand", "hybrid_override_pattern", "num_hidden_layers"})
    EXPECT_FALSE(out.contains(gone)) << gone;
  EXPECT_EQ(out["n_groups"], 4);
  EXPECT_EQ(out["conv_kernel"], 3);
  EXPECT_EQ(out["chunk_size"], 16);
  EXPECT_EQ(out["time_step_min"], 0.01);
  EXPECT_EQ(out["use_conv_bias"], false);
  EXPECT_EQ(out["expand"], 7);
  EXPECT_EQ(out["layer_norm_epsilon"], 1e-6);
  EXPECT_EQ(out["layers_block_type"],
            json({"linear_attention", "full_attention", "moe", "mlp", "linear_attention"}));
  EXPECT_EQ(DecoderSpec::from_json(out, "config.json").to_json(), out);
}

// NemotronHConfig's defaults when fields are absent (its default layer list: M E * -).
TEST(NemotronHFamily, DefaultsAreNemotronHConfig) {
  const DecoderSpec s = DecoderSpec::from_json({{"architectures", {"NemotronHForCausalLM"}}}, "config.json");
  EXPECT_EQ(kinds_of(s), (std::vector<SublayerKind>{M, E, A, D}));
  EXPECT_EQ(s.vocab_size, 131072);
  EXPECT_EQ(s.hidden_size, 4096);
  const Mamba2Spec& m = *s.mamba2_of(0);
  EXPECT_EQ(m.heads, 128);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.state, 128);
  EXPECT_EQ(m.groups, 8);
  EXPECT_EQ(m.conv_kernel, 4);
  EXPECT_EQ(m.chunk, 128);
  EXPECT_TRUE(m.conv_bias);
  const AttentionSpec& a = *s.attention_of(2);
  EXPECT_EQ(a.heads, 32);
  EXPECT_EQ(a.kv_heads, 8);
  EXPECT_EQ(a.head_dim, 128);
  EXPECT_EQ(s.mlp_of(3)->intermediate_size, 21504);
  const MoeSpec& e = *s.moe_of(1);
  EXPECT_EQ(e.num_experts, 8);
  EXPECT_EQ(e.experts_per_token, 2);
  EXPECT_EQ(e.expert.intermediate_size, 7688);
  EXPECT_EQ(e.shared_expert->intermediate_size, 7688);
  EXPECT_DOUBLE_EQ(e.router.scale, 1.0);
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-5);
}

TEST(NemotronHFamily, HostileConfigsNameTheField) {
  const json base = read_json(kFixtures / "hybrid_all_kinds" / "ckpt" / "config.json");
  auto expect_bad = [&](const char* field, const json& value, const char* fragment) {
    json j = base;
    if (value.is_discarded())
      j.erase(field);
    else
      j[field] = value;
    try {
      DecoderSpec::from_json(j, "cfg.json");
      ADD_FAILURE() << field << " = " << value.dump() << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("cfg.json: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  expect_bad("layers_block_type", json::array(), "field 'layers_block_type'");
  expect_bad("layers_block_type", "MEM", "field 'layers_block_type'");
  expect_bad("layers_block_type", {"mamba", "sliding_attention"}, "field 'layers_block_type[1]'");
  expect_bad("layers_block_type", {"mamba", 3}, "field 'layers_block_type[1]'");
  expect_bad("layer_types", {"mamba"}, "field 'layer_types'");  // an alias that disagrees
  {
    json j = base;
    j.erase("layers_block_type");
    j["hybrid_override_pattern"] = "ME*X";
    EXPECT_THROW(DecoderSpec::from_json(j, "cfg.json"), Error);
    j["hybrid_override_pattern"] = "";
    EXPECT_THROW(DecoderSpec::from_json(j, "cfg.json"), Error);
  }
  expect_bad("num_hidden_layers", -1, "field 'num_hidden_layers'");
  expect_bad("mamba_num_heads", 0, "field 'mamba_num_heads'");
  expect_bad("mamba_head_dim", -16, "field 'mamba_head_dim'");
  expect_bad("ssm_state_size", nullptr, "field 'ssm_state_size'");
  expect_bad("n_groups", 3, "field 'n_groups'");  // 4 heads do not split into 3 groups
  expect_bad("n_groups", 0, "field 'n_groups'");
  expect_bad("mamba_n_groups", 3, "field 'mamba_n_groups'");  // the legacy spelling is the one read and named
  expect_bad("conv_kernel", 0, "field 'conv_kernel'");
  expect_bad("chunk_size", 0, "field 'chunk_size'");
  expect_bad("chunk_size", 8.5, "field 'chunk_size'");
  expect_bad("use_conv_bias", "true", "field 'use_conv_bias'");
  expect_bad("use_bias", 1, "field 'use_bias'");
  expect_bad("time_step_min", 0.0, "field 'time_step_min'");
  expect_bad("time_step_min", -0.1, "field 'time_step_min'");
  expect_bad("time_step_max", "0.1", "field 'time_step_max'");
  expect_bad("time_step_floor", -1.0, "field 'time_step_floor'");
  expect_bad("mamba_hidden_act", "gelu", "field 'mamba_hidden_act'");
  expect_bad("mlp_hidden_act", "silu", "field 'mlp_hidden_act'");
  expect_bad("mlp_bias", true, "field 'mlp_bias'");
  expect_bad("moe_latent_size", 16, "field 'moe_latent_size'");
  expect_bad("attention_dropout", 0.1, "field 'attention_dropout'");
  expect_bad("num_key_value_heads", 3, "field 'num_key_value_heads'");
  expect_bad("head_dim", nullptr, "field 'head_dim'");
  expect_bad("n_routed_experts", 1, "field 'n_routed_experts'");  // no top-2 inside the one group
  expect_bad("num_local_experts", 16, "field 'num_local_experts'");  // disagrees with n_routed_experts
  expect_bad("n_group", 3, "field 'n_group'");
  expect_bad("topk_group", 2, "field 'topk_group'");
  expect_bad("num_experts_per_tok", 9, "field 'num_experts_per_tok'");
  expect_bad("routed_scaling_factor", -2.5, "field 'routed_scaling_factor'");
  expect_bad("norm_topk_prob", "yes", "field 'norm_topk_prob'");
  expect_bad("moe_shared_expert_intermediate_size", 0, "field 'moe_shared_expert_intermediate_size'");
  expect_bad("layer_norm_epsilon", 0.0, "field 'layer_norm_epsilon'");
  expect_bad("num_nextn_predict_layers", -1, "field 'num_nextn_predict_layers'");
  expect_bad("tie_word_embeddings", "no", "field 'tie_word_embeddings'");
  expect_bad("hidden_size", int64_t{1} << 32, "field 'hidden_size'");
  {
    json j = base;  // [E, I, H] = 8 · 2^20 · 2^20 elements, past 2^40
    j["hidden_size"] = int64_t{1} << 20;
    j["moe_intermediate_size"] = int64_t{1} << 20;
    try {
      DecoderSpec::from_json(j, "cfg.json");
      ADD_FAILURE() << "a 2^43-element expert stack was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("field 'n_routed_experts'"), std::string::npos) << e.what();
    }
  }
  expect_bad("dtype", "float8", "field 'dtype'");
  expect_bad("model_type", "nemotron", "field 'model_type'");
}

// The order, names and shapes of Transformers' named_parameters() (the norm before the mixer, the buffer after the
// router weight), its num_parameters() (buffers excluded), and the fixture's gradient names (every parameter).
TEST(NemotronHFamily, ParameterTableFollowsTransformers) {
  const DecoderSpec s = spec_of("hybrid_all_kinds");
  const ParamTable t = param_table_of(s);
  std::vector<std::string> names;
  for (const ParamEntry& e : t.entries()) names.push_back(e.name);
  auto mamba = [](int l) {
    const std::string x = "model.layers." + std::to_string(l) + ".";
    return std::vector<std::string>{x + "norm.weight",          x + "mixer.conv1d.weight", x + "mixer.conv1d.bias",
                                    x + "mixer.in_proj.weight", x + "mixer.dt_bias",       x + "mixer.A_log",
                                    x + "mixer.norm.weight",    x + "mixer.D",             x + "mixer.out_proj.weight"};
  };
  auto moe = [](int l) {
    const std::string x = "model.layers." + std::to_string(l) + ".";
    return std::vector<std::string>{x + "norm.weight",
                                    x + "mixer.experts.up_proj",
                                    x + "mixer.experts.down_proj",
                                    x + "mixer.gate.weight",
                                    x + "mixer.gate.e_score_correction_bias",
                                    x + "mixer.shared_experts.up_proj.weight",
                                    x + "mixer.shared_experts.down_proj.weight"};
  };
  std::vector<std::string> want = {"model.embeddings.weight"};
  for (const auto& part : {mamba(0), moe(1), mamba(2),
                           std::vector<std::string>{"model.layers.3.norm.weight", "model.layers.3.mixer.q_proj.weight",
                                                    "model.layers.3.mixer.k_proj.weight",
                                                    "model.layers.3.mixer.v_proj.weight",
                                                    "model.layers.3.mixer.o_proj.weight"},
                           moe(4),
                           std::vector<std::string>{"model.layers.5.norm.weight", "model.layers.5.mixer.up_proj.weight",
                                                    "model.layers.5.mixer.down_proj.weight"}})
    want.insert(want.end(), part.begin(), part.end());
  want.push_back("model.norm_f.weight");
  want.push_back("lm_head.weight");
  EXPECT_EQ(names, want);
  EXPECT_EQ(param_counts(t).total, read_json(kFixtures / "hybrid_all_kinds" / "meta.json")["hf"]["parameters"]);
  EXPECT_EQ(param_counts(param_table_of(spec_of("one_group_dt_clamp_pattern"))).total,
            read_json(kFixtures / "one_group_dt_clamp_pattern" / "meta.json")["hf"]["parameters"]);
  // Every parameter has Transformers' gradient under the same name and shape; the buffer has none.
  const SafetensorsFile io = SafetensorsFile::open((kFixtures / "hybrid_all_kinds" / "plain.safetensors").string());
  for (const ParamEntry& e : t.entries()) {
    SCOPED_TRACE(e.name);
    if (e.role == ParamRole::buffer) {
      EXPECT_FALSE(io.has("grad." + e.name));
      continue;
    }
    ASSERT_TRUE(io.has("grad." + e.name));
    EXPECT_EQ(io.info("grad." + e.name).shape, e.shape);
  }
  const ParamEntry& bias = *t.find("model.layers.1.mixer.gate.e_score_correction_bias");
  EXPECT_EQ(bias.role, ParamRole::buffer);
  EXPECT_EQ(bias.dtype, ParamDType::f32);
  EXPECT_EQ(t.find("model.layers.1.mixer.experts.up_proj")->role, ParamRole::expert_stack);
  EXPECT_EQ(t.find("model.layers.1.mixer.experts.up_proj")->shape, (Shape{8, 16, 32}));
  // HF Trainer's decay rule (names with "bias" or a norm): dt_bias and the norms are not decayed, A_log and D are.
  EXPECT_FALSE(t.find("model.layers.0.mixer.dt_bias")->decay);
  EXPECT_FALSE(t.find("model.layers.0.mixer.norm.weight")->decay);
  EXPECT_FALSE(t.find("model.layers.0.mixer.conv1d.bias")->decay);
  EXPECT_TRUE(t.find("model.layers.0.mixer.A_log")->decay);
  EXPECT_TRUE(t.find("model.layers.0.mixer.D")->decay);
  EXPECT_TRUE(t.find("model.layers.0.mixer.conv1d.weight")->decay);
  for (const ParamEntry& e : t.entries()) EXPECT_EQ(e.decay, adamw_hf_decays(e.name)) << e.name;
  // ZeRO-3's residency groups come from the table (not from Qwen's names): the embedding's, each layer's, the head's.
  EXPECT_EQ(ShardedParams::group_of(*t.find("model.embeddings.weight"), 6), ParamResidency::kEmbedding);
  EXPECT_EQ(ShardedParams::group_of(*t.find("model.layers.4.mixer.experts.up_proj"), 6), 4);
  EXPECT_EQ(ShardedParams::group_of(*t.find("model.norm_f.weight"), 6), ParamResidency::head(6));
  EXPECT_EQ(ShardedParams::group_of(*t.find("lm_head.weight"), 6), ParamResidency::head(6));
}

// Transformers' Mamba2 init: A_log = log(1..heads), D = 1, dt_bias = softplus⁻¹(dt) with dt in [time_step_min,
// time_step_max]; norms 1; the buffer zero and F32 in a bf16 model.
TEST(NemotronHFamily, RandomInitFollowsTransformers) {
  const DecoderSpec s = spec_of("hybrid_all_kinds");
  const CausalLM m = CausalLM::from_config(s, DType::BF16, 5);
  const LayerWeights& L = m.weights.layers[0];
  const std::vector<float> a_log = L.mamba_a_log.to_floats();
  for (int h = 0; h < 4; ++h) EXPECT_EQ(a_log[h], round_bf16(std::log(float(h + 1))));
  EXPECT_EQ(L.mamba_d.to_floats(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(L.mamba_norm.to_floats(), std::vector<float>(64, 1.0f));
  for (float b : L.mamba_dt_bias.to_floats()) {
    const double dt = std::log1p(std::exp(double(b)));  // softplus
    EXPECT_GE(dt, 1e-3 * 0.99);
    EXPECT_LE(dt, 0.1 * 1.01);
  }
  EXPECT_EQ(m.weights.layers[1].router_score_bias.dtype(), DType::F32);
  EXPECT_EQ(m.weights.layers[1].router_score_bias.to_floats(), std::vector<float>(8, 0.0f));
  EXPECT_EQ(m.weights.layers[1].post_norm.to_floats(), std::vector<float>(32, 1.0f));  // the MoE layer's norm
}

// Every tensor of the checkpoint in memory as Transformers holds it: backbone. -> model., the per-expert up/down
// tensors stacked, the rest under its own name, the buffer F32 also in the bf16 checkpoint.
TEST(NemotronHFamily, LoadsTheCheckpointsInTheEngineLayout) {
  for (const char* sub : {"hybrid_all_kinds/ckpt", "hybrid_all_kinds/ckpt_bf16", "one_group_dt_clamp_pattern/ckpt"}) {
    SCOPED_TRACE(sub);
    const fs::path dir = kFixtures / sub;
    const CausalLM m = CausalLM::from_pretrained(dir.string());
    const CheckpointFiles files = CheckpointFiles::open(dir.string());
    std::map<std::string, std::vector<float>> stored;
    for (const std::string& n : files.names()) stored[n] = files.tensor(n).to_floats();
    const ParamTable& t = m.weights.param_table();
    size_t read = 0;
    for (const ParamEntry& e : t.entries()) {
      SCOPED_TRACE(e.name);
      const std::vector<float> got = m.weights.slot(e).to_floats();
      const std::string hf = e.name.rfind("model.", 0) == 0 ? "backbone." + e.name.substr(6) : e.name;
      if (e.role != ParamRole::expert_stack) {
        EXPECT_EQ(got, stored.at(hf));
        ++read;
        continue;
      }
      const std::string stem = hf.substr(0, hf.rfind('.') + 1), proj = hf.substr(hf.rfind('.') + 1);
      const int64_t n = e.shape[1] * e.shape[2];
      for (int64_t x = 0; x < e.shape[0]; ++x, ++read) {
        const std::vector<float>& w = stored.at(stem + std::to_string(x) + "." + proj + ".weight");
        ASSERT_EQ(std::vector<float>(got.begin() + x * n, got.begin() + (x + 1) * n), w);
      }
    }
    EXPECT_EQ(read, stored.size());
    const int moe_layer = std::string(sub).find("one_group") == 0 ? 2 : 1;
    EXPECT_EQ(m.weights.layers[moe_layer].router_score_bias.dtype(), DType::F32);
  }
}

// hf-numerics.md §6.3: mtp.* tensors are ignored on load (_keys_to_ignore_on_load_unexpected); anything else extra is
// an error naming the tensor.
TEST(NemotronHFamily, MtpTensorsAreIgnoredOnLoad) {
  const fs::path dir = kFixtures / "hybrid_all_kinds" / "ckpt";
  const DecoderSpec spec = spec_of("hybrid_all_kinds");
  const CheckpointFiles files = CheckpointFiles::open(dir.string());
  std::map<std::string, Tensor> tensors;
  for (const std::string& n : files.names()) tensors[n] = files.tensor(n);
  for (const char* extra : {"mtp.layers.0.mixer.q_proj.weight", "mtp.layers.1.enorm.weight"})
    tensors[extra] = Tensor::zeros({2, 2}, DType::F32);
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors) names.push_back(n);
  auto lookup = [&](const std::string& n) { return tensors.at(n); };
  const ModelWeights w = ModelWeights::from_hf(spec, DType::F32, lookup, names, "ckpt");
  EXPECT_EQ(w.layers[3].q_proj.to_floats(), files.tensor("backbone.layers.3.mixer.q_proj.weight").to_floats());
  tensors["backbone.layers.9.mixer.D"] = Tensor::zeros({4}, DType::F32);
  names.push_back("backbone.layers.9.mixer.D");
  try {
    ModelWeights::from_hf(spec, DType::F32, lookup, names, "ckpt");
    ADD_FAILURE() << "an unexpected tensor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backbone.layers.9.mixer.D"), std::string::npos) << e.what();
  }
}

TEST(NemotronHFamily, ConvertRewritesTheSameBytesAndShardMap) {
  test::expect_convert_reproduces(kFixtures / "hybrid_all_kinds" / "ckpt", "nemh_hybrid");
  test::expect_convert_reproduces(kFixtures / "hybrid_all_kinds" / "ckpt_bf16", "nemh_hybrid_bf16");
  test::expect_convert_reproduces(kFixtures / "one_group_dt_clamp_pattern" / "ckpt", "nemh_one_group");
  test::expect_convert_reproduces(kFixtures / "train5" / "final", "nemh_train5");
}

// hf-numerics.md §6.1 / §6.3: Nemotron 3 Nano's layer mix and tensor shapes.
TEST(NemotronHFamily, PresetHasNemotron3NanoShapes) {
  const DecoderSpec s = DecoderSpec::from_json(preset_config_json("nemotron-3-nano-30b-a3b"), "nano");
  EXPECT_EQ(s.num_layers(), 52);
  int counts[4] = {0, 0, 0, 0};
  for (SublayerKind k : kinds_of(s)) ++counts[static_cast<int>(k)];
  EXPECT_EQ(counts[static_cast<int>(M)], 23);
  EXPECT_EQ(counts[static_cast<int>(E)], 23);
  EXPECT_EQ(counts[static_cast<int>(A)], 6);
  EXPECT_EQ(counts[static_cast<int>(D)], 0);
  const ParamTable t = param_table_of(s);
  EXPECT_EQ(t.find("model.embeddings.weight")->shape, (Shape{131072, 2688}));
  EXPECT_EQ(t.find("model.layers.0.mixer.in_proj.weight")->shape, (Shape{10304, 2688}));
  EXPECT_EQ(t.find("model.layers.0.mixer.conv1d.weight")->shape, (Shape{6144, 1, 4}));
  EXPECT_EQ(t.find("model.layers.0.mixer.dt_bias")->shape, (Shape{64}));
  EXPECT_EQ(t.find("model.layers.0.mixer.norm.weight")->shape, (Shape{4096}));
  EXPECT_EQ(t.find("model.layers.0.mixer.out_proj.weight")->shape, (Shape{2688, 4096}));
  EXPECT_EQ(t.find("model.layers.5.mixer.q_proj.weight")->shape, (Shape{4096, 2688}));
  EXPECT_EQ(t.find("model.layers.5.mixer.k_proj.weight")->shape, (Shape{256, 2688}));
  EXPECT_EQ(t.find("model.layers.5.mixer.o_proj.weight")->shape, (Shape{2688, 4096}));
  EXPECT_EQ(t.find("model.layers.1.mixer.gate.weight")->shape, (Shape{128, 2688}));
  EXPECT_EQ(t.find("model.layers.1.mixer.experts.up_proj")->shape, (Shape{128, 1856, 2688}));
  EXPECT_EQ(t.find("model.layers.1.mixer.experts.down_proj")->shape, (Shape{128, 2688, 1856}));
  EXPECT_EQ(t.find("model.layers.1.mixer.shared_experts.up_proj.weight")->shape, (Shape{3712, 2688}));
  EXPECT_EQ(s.moe_of(1)->experts_per_token, 6);
  EXPECT_DOUBLE_EQ(s.moe_of(1)->router.scale, 2.5);
  const ParamCounts c = param_counts(t);
  std::printf("nemotron-3-nano-30b-a3b: %.4g parameters, %.4g active per token\n", double(c.total), double(c.active));
  // --layers 6 keeps the pattern's first six layers (the benchmark slice "MEMEM*").
  json j = preset_config_json("nemotron-3-nano-30b-a3b");
  config_json_set_layers(j, 6);
  EXPECT_EQ(kinds_of(DecoderSpec::from_json(j, "nano6")), (std::vector<SublayerKind>{M, E, M, E, M, A}));
}

}  // namespace
}  // namespace mt
