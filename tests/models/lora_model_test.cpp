// A LoRA adapter on whole models (models/lora_adapter.h, DecoderModel with ModelOptions::lora): B = 0 gives the
// base model's logits bitwise; with random A and B the adapted model equals the base model with merged weights
// W + s·B·A (computed here in double), in logits and loss, and the adapter's gradients equal the chain rule through
// the merged model's weight gradients (dA = s·Bᵀ·dW, dB = s·dW·Aᵀ) on every adapted slot — attention, dense MLP,
// experts; Qwen3-MoE, GPT-OSS (biases, sinks, clamped experts) and DeepSeek-V3 (the MLA projections, the shared
// expert's, dense layers). The base stays frozen: only the router (a
// full-trained target) gets a gradient. Bad adapter settings are one-line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/float_convert.h"
#include "models/decoder_model.h"
#include "models/lora_adapter.h"
#include "models/registry.h"
#include "lora_test_util.h"

namespace mt {
namespace {

using namespace test;

// W + s·B·A in double, per adapted weight (each expert of a stack), F32 base.
ModelWeights merged_in_double(const DecoderSpec& s, const ModelWeights& base, const LoraWeights& l) {
  ModelWeights m = ModelWeights::zeros_like_config(s, DType::F32);
  const auto src = base.named_parameters();
  auto dst = m.named_parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].second->copy_from(*src[i].second);
  const double sc = l.table->config.scaling();
  const int64_t r = l.table->config.r;
  for (size_t i = 0; i < l.table->entries.size(); i += 2) {
    const LoraEntry& ea = l.table->entries[i];
    Tensor& w = m.slot(*m.param_table().find(ea.base));
    const float* a = l.slot(ea).data_as<float>();
    const float* b = l.slot(l.table->entries[i + 1]).data_as<float>();
    const int64_t E = ea.role == ParamRole::expert_stack ? w.dim(0) : 1, in = ea.in, out = ea.out;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < in; ++k) {
          double d = 0;
          for (int64_t j = 0; j < r; ++j) d += double(b[(e * out + o) * r + j]) * a[(e * r + j) * in + k];
          float& wv = w.data_as<float>()[(e * out + o) * in + k];
          wv = static_cast<float>(wv + sc * d);
        }
  }
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

class LoraModel : public ::testing::TestWithParam<const char*> {
 protected:
  DecoderSpec spec() const {
    const std::string f = GetParam();
    if (f == "deepseek_v3") return deepseek_v3_spec("mla_yarn_dense1");           // q LoRA, dense + MoE layers
    if (f == "deepseek_v3_q_proj") return deepseek_v3_spec("plain_q_legacy_config");  // q_proj, 2 shared experts
    return f == "qwen3_moe" ? qwen_spec() : gpt_oss_spec();
  }
};

TEST_P(LoraModel, ZeroBGivesTheBaseLogitsBitwise) {
  const DecoderSpec s = spec();
  for (DType dt : {DType::F32, DType::BF16}) {
    ModelWeights w = ModelWeights::random_init(s, dt, 3);
    auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of(all_targets(s)), "test"));
    LoraWeights l = LoraWeights::init(table, s.num_layers(), 9);
    ModelOptions o;
    o.lora = &l;
    const Batch b = batch_of(s);
    DecoderModel base(s, w), adapted(s, w, o);
    const auto want = base.forward(b, true).logits.to_floats();
    EXPECT_EQ(adapted.forward(b, true).logits.to_floats(), want) << dtype_safetensors_name(dt);
    // A is not zero (PEFT's init), so a non-zero B would change the logits: the check above can fail.
    bool a_nonzero = false;
    for (const auto& [n, t] : l.named_parameters())
      if (n.find("lora_A") != std::string::npos)
        for (float v : t->to_floats()) a_nonzero = a_nonzero || v != 0;
    EXPECT_TRUE(a_nonzero);
  }
}

TEST_P(LoraModel, EqualsMergedWeightsForwardAndGradients) {
  const DecoderSpec s = spec();
  ModelWeights w = ModelWeights::random_init(s, DType::F32, 4);
  auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of(all_targets(s)), "test"));
  LoraWeights l = random_adapter(table, s.num_layers(), 10);
  ModelWeights m = merged_in_double(s, w, l);
  const Batch b = batch_of(s);
  ModelOptions o;
  o.lora = &l;
  DecoderModel adapted(s, w, o), merged(s, m);
  const auto fa = adapted.forward(b, true), fm = merged.forward(b, true);
  // fp32 over a 3-layer model: rounding of W + s·B·A and of the two orders of summation, ~1e-6 relative per op.
  EXPECT_LE(max_abs_diff(fa.logits.to_floats(), fm.logits.to_floats()), 1e-4);
  EXPECT_NEAR(fa.loss, fm.loss, 1e-5 * std::fabs(fm.loss));

  ModelWeights gbase = lora_base_grads(s, *table);
  LoraWeights gl = LoraWeights::zeros(table, s.num_layers());
  const auto ra = adapted.forward_backward(b, gbase, gl);
  ModelWeights gm = ModelWeights::zeros_like_config(s, DType::F32);
  const auto rm = merged.forward_backward(b, gm);
  EXPECT_NEAR(ra.loss, rm.loss, 1e-5 * std::fabs(rm.loss));

  // Frozen: only the router (full-trained) has a gradient buffer.
  for (const ParamEntry& e : gbase.param_table().entries()) {
    const bool router = e.slot == WeightSlot::router || e.slot == WeightSlot::router_bias;
    EXPECT_EQ(gbase.slot(e).defined(), router) << e.name;
    if (router) {
      const auto got = gbase.slot(e).to_floats(), want = gm.slot(e).to_floats();
      double scale = 0;
      for (float v : want) scale = std::max(scale, double(std::fabs(v)));
      EXPECT_LE(max_abs_diff(got, want), 1e-4 * scale + 1e-7) << e.name;
    }
  }
  // dA = s·Bᵀ·dW, dB = s·dW·Aᵀ per adapted weight.
  const double sc = table->config.scaling();
  const int64_t r = table->config.r;
  int checked = 0;
  for (size_t i = 0; i < table->entries.size(); i += 2) {
    const LoraEntry& ea = table->entries[i];
    const LoraEntry& eb = table->entries[i + 1];
    const auto dw = gm.slot(*gm.param_table().find(ea.base)).to_floats();
    const auto a = l.slot(ea).to_floats(), bb = l.slot(eb).to_floats();
    const auto ga = gl.slot(ea).to_floats(), gb = gl.slot(eb).to_floats();
    const int64_t E = ea.role == ParamRole::expert_stack ? table->num_experts : 1, in = ea.in, out = ea.out;
    std::vector<double> wa(ga.size(), 0.0), wb(gb.size(), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o2 = 0; o2 < out; ++o2)
        for (int64_t k = 0; k < in; ++k) {
          const double g = dw[(e * out + o2) * in + k];
          for (int64_t j = 0; j < r; ++j) {
            wa[(e * r + j) * in + k] += sc * bb[(e * out + o2) * r + j] * g;
            wb[(e * out + o2) * r + j] += sc * g * a[(e * r + j) * in + k];
          }
        }
    double sa = 0, sb = 0, ea_ = 0, eb_ = 0;
    for (size_t k = 0; k < wa.size(); ++k) sa = std::max(sa, std::fabs(wa[k])), ea_ = std::max(ea_, std::fabs(ga[k] - wa[k]));
    for (size_t k = 0; k < wb.size(); ++k) sb = std::max(sb, std::fabs(wb[k])), eb_ = std::max(eb_, std::fabs(gb[k] - wb[k]));
    // fp32 gradients through 3 layers against a double chain rule on fp32 dW: 1e-4 of the largest entry.
    EXPECT_LE(ea_, 1e-4 * sa + 1e-7) << ea.name;
    EXPECT_LE(eb_, 1e-4 * sb + 1e-7) << eb.name;
    EXPECT_GT(sa, 0) << ea.name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(table->entries.size() / 2));
}

INSTANTIATE_TEST_SUITE_P(Families, LoraModel,
                         ::testing::Values("qwen3_moe", "gpt_oss", "deepseek_v3", "deepseek_v3_q_proj"),
                         [](const auto& info) { return std::string(info.param); });

TEST(LoraTable, NamesShapesAndCounts) {
  const DecoderSpec s = qwen_spec();
  const LoraTable t = lora_table_of(s, config_of({"q_proj", "experts", "down_proj", "router"}, 4), "recipe.yaml");
  // Layer 0 (MoE): q_proj A/B, experts gate_up A/B, down A/B; layer 1 (dense): q_proj, mlp down_proj; layer 2 as 0.
  ASSERT_EQ(t.entries.size(), 2u * (3 + 2 + 3));
  EXPECT_EQ(t.entries[0].name, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(t.entries[0].shape, (Shape{4, 12}));
  EXPECT_EQ(t.entries[1].name, "model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(t.entries[1].shape, (Shape{24, 4}));
  EXPECT_EQ(t.entries[2].name, "model.layers.0.mlp.experts.gate_up_proj.lora_A.weight");
  EXPECT_EQ(t.entries[2].shape, (Shape{4, 4, 12}));  // [E, r, H]
  EXPECT_EQ(t.entries[3].shape, (Shape{4, 10, 4}));  // [E, 2I, r]
  EXPECT_EQ(t.entries[4].shape, (Shape{4, 4, 5}));   // down: [E, r, I]
  EXPECT_EQ(t.entries[5].shape, (Shape{4, 12, 4}));  // [E, H, r]
  EXPECT_EQ(t.entries[8].name, "model.layers.1.mlp.down_proj.lora_A.weight");
  EXPECT_EQ(t.full, (std::vector<std::string>{"model.layers.0.mlp.gate.weight", "model.layers.2.mlp.gate.weight"}));
  // q (3 layers): 4·12 + 24·4; experts (layers 0, 2): 4·(4·12 + 10·4 + 4·5 + 12·4); dense down: 4·10 + 12·4.
  EXPECT_EQ(lora_parameter_count(t), 3 * (48 + 96) + 2 * 4 * (48 + 40 + 20 + 48) + (40 + 48));
  EXPECT_DOUBLE_EQ(t.config.scaling(), 5.0 / 4);
  LoraConfig rs = config_of({"q_proj"}, 4);
  rs.use_rslora = true;
  EXPECT_DOUBLE_EQ(rs.scaling(), 5.0 / 2);
}

TEST(LoraTable, OneLineErrors) {
  const DecoderSpec s = qwen_spec();
  auto err = [&](LoraConfig c) {
    try {
      lora_table_of(s, c, "r.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(err(config_of({"qproj"})),
            "r.yaml: peft.target: 'qproj' is not a LoRA target of qwen3_moe models (known: q_proj, k_proj, v_proj, "
            "o_proj, gate_proj, up_proj, down_proj, experts, router)");
  EXPECT_EQ(err(config_of({})), "r.yaml: peft.target: must list at least one target");
  EXPECT_EQ(err(config_of({"q_proj", "q_proj"})), "r.yaml: peft.target: 'q_proj' is listed twice");
  EXPECT_EQ(err(config_of({"q_proj"}, 0)), "r.yaml: peft.r: must be an integer >= 1 (found 0)");
  LoraConfig bad_alpha = config_of({"q_proj"});
  bad_alpha.alpha = 0;
  EXPECT_EQ(err(bad_alpha), "r.yaml: peft.alpha: must be a number > 0 (found 0)");
  // GPT-OSS has no dense MLP layers, and no gate_proj target at all.
  const DecoderSpec g = gpt_oss_spec();
  EXPECT_THROW(lora_table_of(g, config_of({"gate_proj"}), "r.yaml"), Error);
  // A Qwen3-MoE model whose layers are all MoE has nothing for gate_proj.
  nlohmann::json j = s.raw;
  j["mlp_only_layers"] = nlohmann::json::array();
  const DecoderSpec all_moe = DecoderSpec::from_json(j, "c.json");
  try {
    lora_table_of(all_moe, config_of({"gate_proj"}), "r.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "r.yaml: peft.target: 'gate_proj' matches no parameter of this model (no layer has that sublayer)");
  }
}

TEST(LoraMerge, MergeIntoEqualsBasePlusScaledBA) {
  const DecoderSpec s = qwen_spec();
  ModelWeights w = ModelWeights::random_init(s, DType::F32, 6);
  auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of(all_targets(s)), "test"));
  LoraWeights l = random_adapter(table, s.num_layers(), 12);
  ModelWeights want = merged_in_double(s, w, l);
  ModelWeights got = ModelWeights::random_init(s, DType::F32, 6);
  lora_merge_into(got, l);
  const auto g = got.named_parameters(), wn = want.named_parameters(), base = w.named_parameters();
  int changed = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const auto a = g[i].second->to_floats(), b = wn[i].second->to_floats(), c = base[i].second->to_floats();
    for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-6 * std::max(1.0f, std::fabs(b[k]))) << g[i].first;
    changed += a != c;
  }
  EXPECT_EQ(changed, static_cast<int>(table->entries.size() / 2));  // exactly the adapted weights moved

  // bf16: Δ as the fp32 merge computes it, taken from a merge into a zero base (0 + Δ is Δ exactly).
  ModelWeights zero = ModelWeights::zeros_like_config(s, DType::F32);
  lora_merge_into(zero, l);  // exactly fp32(s·fp32(B·A)) per element: 0 + x is x
  ModelWeights wb = ModelWeights::random_init(s, DType::BF16, 6);
  ModelWeights wb0 = ModelWeights::random_init(s, DType::BF16, 6);
  lora_merge_into(wb, l);
  const auto nb = wb.named_parameters(), n0 = wb0.named_parameters(), nz = zero.named_parameters();
  // PEFT's ParamWrapper (expert stacks, and a Qwen3-MoE dense layer's MLP weights, which mixtune saves in
  // target_parameters) casts Δ to bf16 before the add: two roundings; nn.Linear targets one.
  int two_roundings = 0;
  for (size_t i = 0; i < nb.size(); ++i) {
    const std::string& n = nb[i].first;
    const bool dense_mlp = n.find(".mlp.gate_proj.") != std::string::npos ||
                           n.find(".mlp.up_proj.") != std::string::npos || n.find(".mlp.down_proj.") != std::string::npos;
    const bool as_parameter = got.param_table().is_expert_stack(n) || dense_mlp;
    two_roundings += as_parameter;
    const auto a = nb[i].second->to_floats(), w0 = n0[i].second->to_floats(), d = nz[i].second->to_floats();
    for (size_t k = 0; k < a.size(); ++k)
      ASSERT_EQ(a[k], round_bf16(w0[k] + (as_parameter ? round_bf16(d[k]) : d[k]))) << n;
  }
  EXPECT_EQ(two_roundings, 2 * 2 + 3);  // two MoE layers' stacks, the dense layer's gate, up and down
}

}  // namespace
}  // namespace mt
