// LoRA adapters in PEFT's files (models/lora_checkpoint.h): a saved adapter reloads bit-identically; the names and
// shapes are PEFT's (docs/peft-format.md); the expert tensors follow PEFT's ParamWrapper layout, checked by
// computing PEFT's delta from the saved file with PEFT's formula (A.reshape(E, r, in), B.reshape(out, r, E),
// einsum) and comparing it with the engine's s·B_e·A_e, in Transformers' parameter layout (GPT-OSS: [E, H, 2I]
// with gate/up interleaved); the config round-trips and bad configs are one-line errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/lora_checkpoint.h"
#include "lora_test_util.h"
#include "../io/io_test_util.h"

namespace mt {
namespace {

using namespace test;
namespace fs = std::filesystem;

void expect_same(const LoraWeights& a, const LoraWeights& b) {
  const auto na = a.named_parameters(), nb = b.named_parameters();
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(na[i].first, nb[i].first);
    EXPECT_EQ(na[i].second->shape(), nb[i].second->shape());
    EXPECT_EQ(na[i].second->to_floats(), nb[i].second->to_floats()) << na[i].first;
  }
}

TEST(LoraCheckpoint, SavedAdapterReloadsBitIdentically) {
  for (const DecoderSpec& s : {qwen_spec(), gpt_oss_spec(), deepseek_v3_spec("mla_yarn_dense1"),
                               deepseek_v3_spec("plain_q_legacy_config")}) {
    io_test::ScratchDir dir;
    ModelWeights base = ModelWeights::random_init(s, DType::BF16, 1);
    auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of(all_targets(s)), "t"));
    LoraWeights l = random_adapter(table, s.num_layers(), 2);
    // The router trains in full: give it values a fresh base does not have.
    ModelWeights trained = ModelWeights::random_init(s, DType::BF16, 77);
    for (const std::string& n : table->full) base.slot(*base.param_table().find(n)).copy_from(trained.slot(*trained.param_table().find(n)));
    lora_save_pretrained(dir.file("adapter"), s, l, base, "base/path");
    ModelWeights fresh = ModelWeights::random_init(s, DType::BF16, 1);
    LoraWeights back = lora_load_pretrained(dir.file("adapter"), s, fresh);
    expect_same(l, back);
    EXPECT_DOUBLE_EQ(back.table->config.scaling(), l.table->config.scaling());
    const auto nb = base.named_parameters(), nf = fresh.named_parameters();
    for (size_t i = 0; i < nb.size(); ++i)
      EXPECT_EQ(nb[i].second->to_floats(), nf[i].second->to_floats()) << nb[i].first;  // router copied, rest as is
  }
}

TEST(LoraCheckpoint, PeftNamesShapesAndConfig) {
  const DecoderSpec s = qwen_spec();  // E 4, H 12, I 5, dense layer 1 (F 10)
  io_test::ScratchDir dir;
  ModelWeights base = ModelWeights::random_init(s, DType::F32, 1);
  auto table = std::make_shared<const LoraTable>(
      lora_table_of(s, config_of({"q_proj", "o_proj", "experts", "down_proj", "router"}, 3), "t"));
  lora_save_pretrained(dir.file("a"), s, random_adapter(table, s.num_layers(), 3), base, "Qwen/x");
  const SafetensorsFile f = SafetensorsFile::open(dir.file("a/adapter_model.safetensors"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const std::string p = "base_model.model.model.layers.";
  const std::vector<std::pair<std::string, Shape>> want = {
      {p + "0.self_attn.q_proj.lora_A.weight", {3, 12}},
      {p + "0.self_attn.q_proj.lora_B.weight", {24, 3}},
      {p + "0.self_attn.o_proj.lora_A.weight", {3, 24}},
      {p + "0.self_attn.o_proj.lora_B.weight", {12, 3}},
      {p + "0.mlp.experts.base_layer.lora_A.weight", {4 * 3, 12}},  // gate_up_proj: inner wrapper, [E·r, H]
      {p + "0.mlp.experts.base_layer.lora_B.weight", {10, 3 * 4}},  // [2I, r·E]
      {p + "0.mlp.experts.lora_A.weight", {4 * 3, 5}},              // down_proj: outer wrapper, [E·r, I]
      {p + "0.mlp.experts.lora_B.weight", {12, 3 * 4}},             // [H, r·E]
      {p + "0.mlp.gate.weight", {4, 12}},                           // router: modules_to_save
      {p + "1.mlp.down_proj.lora_A.weight", {3, 10}},
      {p + "1.mlp.down_proj.lora_B.weight", {12, 3}},
      {p + "2.mlp.experts.lora_B.weight", {12, 3 * 4}},
  };
  for (const auto& [name, shape] : want) {
    ASSERT_TRUE(f.has(name)) << name;
    EXPECT_EQ(f.info(name).shape, shape) << name;
    EXPECT_EQ(f.info(name).dtype, DType::F32) << name;
  }
  EXPECT_EQ(f.names().size(), 3u * 4 + 2 * 4 + 2 + 2);  // q, o per layer; experts 0, 2; dense down; 2 routers
  std::ifstream in(dir.file("a/adapter_config.json"));
  const nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c["peft_type"], "LORA");
  EXPECT_EQ(c["r"], 3);
  EXPECT_EQ(c["lora_alpha"], 5.0);
  EXPECT_EQ(c["target_modules"], nlohmann::json({"q_proj", "o_proj"}));
  // In the family's order. The dense layer's down_proj as a parameter (PEFT would turn a down_proj module target of a qwen3_moe model
  // into the experts' down_proj), the two expert stacks.
  EXPECT_EQ(c["target_parameters"],
            nlohmann::json({"mlp.down_proj.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));
  EXPECT_EQ(c["modules_to_save"], nlohmann::json({"gate"}));
  EXPECT_EQ(c["base_model_name_or_path"], "Qwen/x");
  const LoraConfig back = lora_config_read(dir.file("a"), s);
  EXPECT_EQ(back.r, 3);
  EXPECT_EQ(back.alpha, 5.0);
  // In the family's order.
  EXPECT_EQ(back.target, (std::vector<std::string>{"q_proj", "o_proj", "down_proj", "experts", "router"}));
}

// DeepSeek-V3: the MLA projections as modules; gate/up/down_proj name a dense layer's MLP and the shared expert's
// alike (PEFT matches module-name suffixes) and go to target_parameters as for qwen3_moe (Transformers v5 converts
// deepseek_v3 checkpoints the same way). Not checked against PEFT itself (no DeepSeek-V3 PEFT fixture yet).
TEST(LoraCheckpoint, DeepseekV3NamesAndConfig) {
  const DecoderSpec s = deepseek_v3_spec("mla_yarn_dense1");  // H 32, q LoRA 16, kv LoRA 16, 4 heads; layer 0 dense
  io_test::ScratchDir dir;
  ModelWeights base = ModelWeights::random_init(s, DType::F32, 1);
  auto table = std::make_shared<const LoraTable>(
      lora_table_of(s, config_of({"q_a_proj", "kv_b_proj", "o_proj", "gate_proj", "experts"}, 2), "t"));
  lora_save_pretrained(dir.file("a"), s, random_adapter(table, s.num_layers(), 3), base, "deepseek/x");
  const SafetensorsFile f = SafetensorsFile::open(dir.file("a/adapter_model.safetensors"));
  const std::string p = "base_model.model.model.layers.";
  const std::vector<std::pair<std::string, Shape>> want = {
      {p + "0.self_attn.q_a_proj.lora_A.weight", {2, 32}},
      {p + "0.self_attn.q_a_proj.lora_B.weight", {16, 2}},
      {p + "1.self_attn.kv_b_proj.lora_A.weight", {2, 16}},
      {p + "1.self_attn.kv_b_proj.lora_B.weight", {160, 2}},
      {p + "0.mlp.gate_proj.lora_B.weight", {48, 2}},
      {p + "1.mlp.shared_experts.gate_proj.lora_A.weight", {2, 32}},
      {p + "1.mlp.experts.base_layer.lora_A.weight", {8 * 2, 32}},
  };
  for (const auto& [name, shape] : want) {
    ASSERT_TRUE(f.has(name)) << name;
    EXPECT_EQ(f.info(name).shape, shape) << name;
  }
  EXPECT_EQ(f.names().size(), 2u * (2 + 2 + 2) + 2 * 2 + 4);  // q_a, kv_b, o per layer; gate_proj 0 and 1; experts
  std::ifstream in(dir.file("a/adapter_config.json"));
  const nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c["target_modules"], nlohmann::json({"q_a_proj", "kv_b_proj", "o_proj"}));
  EXPECT_EQ(c["target_parameters"], nlohmann::json({"mlp.gate_proj.weight", "mlp.shared_experts.gate_proj.weight",
                                                    "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));
  EXPECT_EQ(lora_config_read(dir.file("a"), s).target,
            (std::vector<std::string>{"q_a_proj", "kv_b_proj", "o_proj", "gate_proj", "experts"}));
}

// The router trained in full is a PEFT modules_to_save copy, saved as its whole state dict: DeepSeek-V3's (and
// Nemotron-H's) gate holds the persistent fp32 buffer e_score_correction_bias beside its weight, so PEFT's file has
// both. We write it, read it when present (it replaces the base's, as PEFT's loaded copy does) and still read
// adapters without it.
TEST(LoraCheckpoint, RouterSavedWithItsSelectionBiasAsPeftDoes) {
  const DecoderSpec s = deepseek_v3_spec("mla_yarn_dense1");  // layer 0 dense, layer 1 MoE (8 experts)
  io_test::ScratchDir dir;
  ModelWeights base = ModelWeights::random_init(s, DType::F32, 1);
  base.layers[1].router_score_bias = Tensor::from_floats({8}, {0.5f, -0.25f, 0.125f, 0, 1, -1, 2, -2});
  auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of({"o_proj", "router"}, 2), "t"));
  const LoraWeights l = random_adapter(table, s.num_layers(), 3);
  lora_save_pretrained(dir.file("a"), s, l, base, "deepseek/x");
  const std::string bias = "base_model.model.model.layers.1.mlp.gate.e_score_correction_bias";
  {
    const SafetensorsFile f = SafetensorsFile::open(dir.file("a/adapter_model.safetensors"));
    ASSERT_TRUE(f.has(bias));
    EXPECT_EQ(f.info(bias).dtype, DType::F32);
    EXPECT_EQ(f.tensor(bias).to_floats(), base.layers[1].router_score_bias.to_floats());
    EXPECT_TRUE(f.has("base_model.model.model.layers.1.mlp.gate.weight"));
    EXPECT_EQ(f.names().size(), 2u * 2 + 2);  // o_proj A and B per layer; layer 1's router weight and bias
  }
  // Read back into a base whose bias differs: the file's replaces it.
  ModelWeights fresh = ModelWeights::random_init(s, DType::F32, 2);
  lora_load_pretrained(dir.file("a"), s, fresh);
  EXPECT_EQ(fresh.layers[1].router_score_bias.to_floats(), base.layers[1].router_score_bias.to_floats());
  // Without the bias (an adapter saved before it was written): loads, the base's bias stays.
  auto tensors = lora_to_peft(l, base);
  ASSERT_EQ(tensors.back().first, bias);
  tensors.pop_back();
  safetensors_write(dir.file("a/adapter_model.safetensors"), tensors);
  ModelWeights other = ModelWeights::random_init(s, DType::F32, 3);
  const std::vector<float> before = other.layers[1].router_score_bias.to_floats();
  lora_load_pretrained(dir.file("a"), s, other);
  EXPECT_EQ(other.layers[1].router_score_bias.to_floats(), before);
  // A wrong shape is a one-line error naming the tensor.
  tensors.emplace_back(bias, Tensor::zeros({7}, DType::F32));
  safetensors_write(dir.file("a/adapter_model.safetensors"), tensors);
  try {
    lora_load_pretrained(dir.file("a"), s, other);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + bias + "' is F32 [7]"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

// PEFT's ParamWrapper delta from the saved tensors, for expert e: A = lora_A.reshape(E, r, in)[e],
// B = lora_B.reshape(out, r, E)[:, :, e], ΔW_e = s·B·A ([out, in] in Transformers' out/in numbering).
std::vector<double> peft_delta(const SafetensorsFile& f, const std::string& key_prefix, int64_t E, int64_t r,
                               int64_t in, int64_t out, double s, int64_t e) {
  const auto a = f.tensor(key_prefix + "lora_A.weight").to_floats(), b = f.tensor(key_prefix + "lora_B.weight").to_floats();
  std::vector<double> d(static_cast<size_t>(out * in), 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < r; ++j) d[o * in + i] += s * b[(o * r + j) * E + e] * a[(e * r + j) * in + i];
  return d;
}

TEST(LoraCheckpoint, ExpertTensorsFollowPeftParamWrapperLayout) {
  for (const DecoderSpec& s : {qwen_spec(), gpt_oss_spec()}) {
    const bool gpt = s.model_type == "gpt_oss";
    io_test::ScratchDir dir;
    ModelWeights base = ModelWeights::random_init(s, DType::F32, 1);
    auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of({"experts"}, 2), "t"));
    LoraWeights l = random_adapter(table, s.num_layers(), 4);
    lora_save_pretrained(dir.file("a"), s, l, base, "b");
    const SafetensorsFile f = SafetensorsFile::open(dir.file("a/adapter_model.safetensors"));
    // The merged model in Transformers' layout (to_hf: GPT-OSS's fused, transposed, interleaved stacks; Qwen3-MoE's
    // per-expert hub tensors) minus the base in the same layout is PEFT's delta in that layout.
    ModelWeights merged = ModelWeights::random_init(s, DType::F32, 1);
    lora_merge_into(merged, l);
    const auto hb = base.to_hf(s), hm = merged.to_hf(s);
    std::map<std::string, std::pair<std::vector<float>, std::vector<float>>> by_name;
    for (size_t i = 0; i < hb.size(); ++i) by_name[hb[i].first] = {hb[i].second.to_floats(), hm[i].second.to_floats()};
    const int64_t E = table->num_experts, r = 2;
    const double sc = table->config.scaling();
    const int l0 = 0;  // the first MoE layer in both specs
    const std::string key = "base_model.model.model.layers.0.mlp.experts.";
    const MoeSpec& m = s.moe[0];
    const int64_t H = s.hidden_size, I = m.expert.intermediate_size;
    int compared = 0;
    for (int64_t e = 0; e < E; ++e) {
      // gate_up: inner wrapper; in H, out 2I (Transformers' out numbering: Qwen gate rows then up rows; GPT-OSS
      // interleaved); down: in I, out H.
      const auto dgu = peft_delta(f, key + "base_layer.", E, r, H, 2 * I, sc, e);
      const auto ddn = peft_delta(f, key, E, r, I, H, sc, e);
      auto diff_at = [&](const std::string& name, int64_t idx) {
        const auto& [tb, tm] = by_name.at(name);
        return double(tm[idx]) - double(tb[idx]);
      };
      for (int64_t o = 0; o < 2 * I; ++o)
        for (int64_t i = 0; i < H; ++i) {
          double got;
          if (gpt)  // [E, H, 2I]: ΔW_eᵀ
            got = diff_at(fmt::format("model.layers.{}.mlp.experts.gate_up_proj", l0), (e * H + i) * 2 * I + o);
          else  // hub per-expert gate_proj [I, H] (o < I) and up_proj [I, H]
            got = diff_at(fmt::format("model.layers.{}.mlp.experts.{}.{}_proj.weight", l0, e, o < I ? "gate" : "up"),
                          (o % I) * H + i);
          EXPECT_NEAR(got, dgu[o * H + i], 1e-5) << s.model_type << " gate_up e" << e << " o" << o << " i" << i;
          ++compared;
        }
      for (int64_t o = 0; o < H; ++o)
        for (int64_t i = 0; i < I; ++i) {
          const double got = gpt ? diff_at(fmt::format("model.layers.{}.mlp.experts.down_proj", l0), (e * I + i) * H + o)
                                 : diff_at(fmt::format("model.layers.{}.mlp.experts.{}.down_proj.weight", l0, e), o * I + i);
          EXPECT_NEAR(got, ddn[o * I + i], 1e-5) << s.model_type << " down e" << e;
          ++compared;
        }
    }
    EXPECT_EQ(compared, E * (2 * I * H + H * I));
  }
}

TEST(LoraCheckpoint, ConfigErrorsAreOneLine) {
  const DecoderSpec s = qwen_spec();
  io_test::ScratchDir dir;
  ModelWeights base = ModelWeights::random_init(s, DType::F32, 1);
  auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of({"q_proj", "experts"}), "t"));
  lora_save_pretrained(dir.file("a"), s, random_adapter(table, s.num_layers(), 3), base, "b");
  const std::string cfg = dir.file("a/adapter_config.json");
  std::ifstream in(cfg);
  const nlohmann::json good = nlohmann::json::parse(in);
  auto err_with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = good;
    j[key] = value;
    std::ofstream(cfg) << j.dump(2);
    try {
      lora_config_read(dir.file("a"), s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(err_with("use_dora", true), cfg + ": use_dora: true is not supported (DoRA is not implemented)");
  EXPECT_EQ(err_with("rank_pattern", {{"q_proj", 8}}),
            cfg + ": rank_pattern: {\"q_proj\":8} is not supported (per-target rank is not implemented)");
  EXPECT_EQ(err_with("target_parameters", {"mlp.experts.down_proj"}),
            cfg + ": target 'experts' covers mlp.experts.gate_up_proj, mlp.experts.down_proj; mixtune's target "
                  "adapts all of them, this adapter only some");
  EXPECT_EQ(err_with("target_modules", {"q_proj", "embed_tokens"}),
            cfg + ": target_modules: 'embed_tokens' is not a LoRA target mixtune knows for qwen3_moe models");
  EXPECT_EQ(err_with("peft_type", "IA3"), cfg + ": peft_type: expected \"LORA\", found \"IA3\"");
  // A full path in target_parameters matches as PEFT's suffix rule does.
  std::ofstream(cfg) << good.dump(2);
  EXPECT_EQ(lora_config_read(dir.file("a"), s).target, (std::vector<std::string>{"q_proj", "experts"}));
}

TEST(LoraCheckpoint, MissingOrExtraTensorsAreErrors) {
  const DecoderSpec s = qwen_spec();
  io_test::ScratchDir dir;
  ModelWeights base = ModelWeights::random_init(s, DType::F32, 1);
  auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of({"q_proj"}), "t"));
  LoraWeights l = random_adapter(table, s.num_layers(), 3);
  lora_save_pretrained(dir.file("a"), s, l, base, "b");
  auto tensors = lora_to_peft(l, base);
  tensors.pop_back();
  safetensors_write(dir.file("a/adapter_model.safetensors"), tensors);
  EXPECT_THROW(lora_load_pretrained(dir.file("a"), s, base), Error);
  tensors = lora_to_peft(l, base);
  tensors.emplace_back("base_model.model.lm_head.lora_A.weight", Tensor::zeros({3, 12}, DType::F32));
  safetensors_write(dir.file("a/adapter_model.safetensors"), tensors);
  try {
    lora_load_pretrained(dir.file("a"), s, base);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'base_model.model.lm_head.lora_A.weight' is not part of the adapter"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mt
