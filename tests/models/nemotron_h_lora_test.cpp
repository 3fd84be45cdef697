// LoRA on Nemotron-H (issue 39) on the hybrid_all_kinds fixture (fp32; layers M E M * E -: Mamba2 mixers, ReLU² experts
// with a ReLU² shared expert, attention, a dense ReLU² MLP), every target the family takes: q/k/v/o_proj, the Mamba2
// mixer's in_proj (its out_proj is refused, as PEFT refuses it), up_proj / down_proj (dense MLP and shared expert), the
// routed experts' up-only and down stacks, the router trained in full. With random non-zero A and B:
//   the adapted model's logits are the merged model's (lora_merge_into: W + s·B·A);
//   the adapter's gradients are the chain rule through the merged model's weight gradients (dA = s·Bᵀ·dW,
//   dB = s·dW·Aᵀ), the routers' gradients the merged model's;
//   PEFT's files: the names (base_model.model.model.layers.N.mixer.in_proj.lora_A.weight, the experts' nested
//   ParamWrappers), adapter_config.json's target lists, and a bit-identical reload.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "../io/io_test_util.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "lora_test_util.h"
#include "models/causal_lm.h"
#include "models/lora_checkpoint.h"

namespace mt {
namespace {

using namespace test;
namespace fs = std::filesystem;

const std::string kCkpt = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/nemotron_h/hybrid_all_kinds/ckpt";
const std::vector<std::string> kAllTargets = {"q_proj",  "k_proj",    "v_proj",  "o_proj", "in_proj",
                                              "up_proj", "down_proj", "experts", "router"};

CausalLM load_fp32() {
  LoadOptions lo;
  lo.dtype = DType::F32;
  return CausalLM::from_pretrained(kCkpt, lo);
}

// Two rows of 20 tokens: the Mamba2 scan crosses chunk boundaries (chunk 8); ids inside the vocabulary of 128.
Batch two_rows() {
  const int64_t B = 2, S = 20;
  Batch b;
  b.input_ids = Tensor::empty({B, S}, DType::I64);
  b.labels = Tensor::empty({B, S}, DType::I64);
  for (int64_t i = 0; i < B * S; ++i) {
    b.input_ids.data_as<int64_t>()[i] = (3 + 29 * i + i * i) % 128;
    b.labels.data_as<int64_t>()[i] = i % 7 == 0 ? -100 : (11 + 17 * i) % 128;
  }
  return b;
}

ModelWeights copy_of(const DecoderSpec& s, const ModelWeights& w) {
  ModelWeights m = ModelWeights::zeros_like_config(s, DType::F32);
  const auto src = w.named_parameters();
  auto dst = m.named_parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].second->copy_from(*src[i].second);
  const auto bsrc = w.named_buffers();
  auto bdst = m.named_buffers();
  for (size_t i = 0; i < bdst.size(); ++i) bdst[i].second->copy_from(*bsrc[i].second);
  return m;
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

TEST(NemotronHLora, TableCoversEveryNewTarget) {
  const CausalLM lm = load_fp32();
  const LoraTable t = lora_table_of(lm.config, config_of(kAllTargets), "test");
  std::set<int> slots;
  for (const LoraEntry& e : t.entries) slots.insert(e.slot);
  using W = WeightSlot;
  for (int slot : {W::mamba_in_proj, W::mlp_up, W::mlp_down, W::shared_up, W::shared_down,
                   W::experts_gate_up, W::experts_down, W::q_proj, W::o_proj})
    EXPECT_TRUE(slots.count(slot)) << "slot " << slot;
  const LoraEntry* in = t.find("model.layers.0.mixer.in_proj.lora_A.weight");
  ASSERT_NE(in, nullptr);
  EXPECT_EQ(in->target, "in_proj");
  EXPECT_EQ(in->shape, (Shape{3, 32}));  // [r, H]
  // in_proj: d_inner 64 + conv_dim (64 + 2·2·16) + heads 4 = 196 outputs.
  EXPECT_EQ(t.find("model.layers.2.mixer.in_proj.lora_B.weight")->shape, (Shape{196, 3}));
  // The up-only expert stack [E, I, H] = [8, 16, 32].
  EXPECT_EQ(t.find("model.layers.1.mixer.experts.up_proj.lora_B.weight")->shape, (Shape{8, 16, 3}));
  EXPECT_EQ(t.find("model.layers.4.mixer.shared_experts.down_proj.lora_A.weight")->shape, (Shape{3, 32}));
  EXPECT_EQ(t.find("model.layers.5.mixer.up_proj.lora_B.weight")->shape, (Shape{48, 3}));
  EXPECT_EQ(t.full, (std::vector<std::string>{"model.layers.1.mixer.gate.weight", "model.layers.4.mixer.gate.weight"}));
}

TEST(NemotronHLora, EqualsMergedModelInLogitsAndGradients) {
  CausalLM lm = load_fp32();
  const DecoderSpec& s = lm.config;
  auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of(kAllTargets), "test"));
  const LoraWeights l = random_adapter(table, s.num_layers(), 21);
  ModelWeights merged_w = copy_of(s, lm.weights);
  lora_merge_into(merged_w, l);
  const Batch b = two_rows();
  ModelOptions o;
  o.lora = &l;
  DecoderModel adapted(s, lm.weights, o), merged(s, merged_w);

  // (a) logits: fp32 over 6 layers, W + s·B·A rounded once against the low-rank path's two GEMMs. The fp32 floor of
  // this fixture: moving every third weight of the merged model by one ulp moves its logits by 1.6e-5 (measured; the
  // adapter here is as large as the weights, Δ std ~ W std), and the two paths differ by 2.3e-5. A wrong layout or
  // a missing adapter moves them by O(1) (checked below against the base).
  const auto fa = adapted.forward(b, true), fm = merged.forward(b, true);
  const auto la = fa.logits.to_floats(), lmv = fm.logits.to_floats();
  double worst = 0, largest = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    worst = std::max(worst, std::fabs(double(la[i]) - lmv[i]));
    largest = std::max(largest, std::fabs(double(lmv[i])));
  }
  EXPECT_LE(worst, 5e-5) << "largest logit " << largest;
  // The adapter matters: the base model's logits are far from these.
  DecoderModel base(s, lm.weights);
  const auto lb = base.forward(b, true).logits.to_floats();
  double moved = 0;
  for (size_t i = 0; i < lb.size(); ++i) moved = std::max(moved, std::fabs(double(lb[i]) - lmv[i]));
  EXPECT_GT(moved, 1e-2);

  // (b) gradients.
  ModelWeights gbase = lora_base_grads(s, *table);
  LoraWeights gl = LoraWeights::zeros(table, s.num_layers());
  const auto ra = adapted.forward_backward(b, gbase, gl);
  ModelWeights gm = ModelWeights::zeros_like_config(s, DType::F32);
  const auto rm = merged.forward_backward(b, gm);
  EXPECT_NEAR(ra.loss, rm.loss, 1e-6 * std::fabs(rm.loss));
  for (const ParamEntry& e : gbase.param_table().entries()) {
    const bool router = e.slot == WeightSlot::router;
    EXPECT_EQ(gbase.slot(e).defined(), router) << e.name;  // the base is frozen but the router
    if (!router) continue;
    const auto want = gm.slot(e).to_floats();
    EXPECT_LE(rel_l2(gbase.slot(e).to_floats(), std::vector<double>(want.begin(), want.end())), 1e-5) << e.name;
  }
  // Against the chain rule through the merged model's fp32 dW (in double): rel-L2 2e-5 at worst (in_proj, whose dt
  // columns pass softplus and the scan's exp), near the fp32 floor above.
  const double sc = table->config.scaling();
  const int64_t r = table->config.r;
  std::set<std::string> targets_checked;
  for (size_t i = 0; i < table->entries.size(); i += 2) {
    const LoraEntry& ea = table->entries[i];
    const LoraEntry& eb = table->entries[i + 1];
    const auto dw = gm.slot(*gm.param_table().find(ea.base)).to_floats();
    const auto a = l.slot(ea).to_floats(), bb = l.slot(eb).to_floats();
    const int64_t E = ea.role == ParamRole::expert_stack ? table->num_experts : 1, in = ea.in, out = ea.out;
    std::vector<double> wa(static_cast<size_t>(E * r * in), 0.0), wb(static_cast<size_t>(E * out * r), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o2 = 0; o2 < out; ++o2)
        for (int64_t k = 0; k < in; ++k) {
          const double g = dw[(e * out + o2) * in + k];
          for (int64_t j = 0; j < r; ++j) {
            wa[(e * r + j) * in + k] += sc * bb[(e * out + o2) * r + j] * g;
            wb[(e * out + o2) * r + j] += sc * g * a[(e * r + j) * in + k];
          }
        }
    EXPECT_LE(rel_l2(gl.slot(ea).to_floats(), wa), 5e-5) << ea.name;
    EXPECT_LE(rel_l2(gl.slot(eb).to_floats(), wb), 5e-5) << eb.name;
    double na = 0;
    for (double v : wa) na += v * v;
    EXPECT_GT(na, 0) << ea.name;  // a gradient reaches every adapted weight
    targets_checked.insert(ea.target);
  }
  EXPECT_EQ(targets_checked.size(), kAllTargets.size() - 1);  // all but the router
}

TEST(NemotronHLora, PeftFilesNamesConfigAndReload) {
  CausalLM lm = load_fp32();
  const DecoderSpec& s = lm.config;
  io_test::ScratchDir dir;
  auto table = std::make_shared<const LoraTable>(lora_table_of(s, config_of(kAllTargets, 4), "test"));
  const LoraWeights l = random_adapter(table, s.num_layers(), 5);
  lora_save_pretrained(dir.file("a"), s, l, lm.weights, "nvidia/x");

  const SafetensorsFile f = SafetensorsFile::open(dir.file("a") + "/adapter_model.safetensors");
  const std::string p = "base_model.model.model.layers.";
  // nn.Linear targets: PEFT's module paths in Transformers v5's memory (model., every layer's module `mixer`).
  EXPECT_EQ(f.info(p + "0.mixer.in_proj.lora_A.weight").shape, (Shape{4, 32}));
  EXPECT_EQ(f.info(p + "0.mixer.in_proj.lora_B.weight").shape, (Shape{196, 4}));
  EXPECT_EQ(f.info(p + "5.mixer.up_proj.lora_A.weight").shape, (Shape{4, 32}));
  EXPECT_EQ(f.info(p + "5.mixer.down_proj.lora_B.weight").shape, (Shape{32, 4}));
  EXPECT_EQ(f.info(p + "1.mixer.shared_experts.up_proj.lora_B.weight").shape, (Shape{32, 4}));
  EXPECT_EQ(f.info(p + "3.mixer.q_proj.lora_A.weight").shape, (Shape{4, 32}));
  // Expert stacks (ParamWrapper): up_proj registered first, so it is the inner wrapper. A [E·r, in], B [out, r·E].
  EXPECT_EQ(f.info(p + "1.mixer.experts.base_layer.lora_A.weight").shape, (Shape{8 * 4, 32}));
  EXPECT_EQ(f.info(p + "1.mixer.experts.base_layer.lora_B.weight").shape, (Shape{16, 4 * 8}));
  EXPECT_EQ(f.info(p + "4.mixer.experts.lora_A.weight").shape, (Shape{8 * 4, 16}));
  EXPECT_EQ(f.info(p + "4.mixer.experts.lora_B.weight").shape, (Shape{32, 4 * 8}));
  EXPECT_EQ(f.info(p + "4.mixer.gate.weight").shape, (Shape{8, 32}));  // modules_to_save
  EXPECT_FALSE(f.has("base_model.model.backbone.layers.0.mixer.in_proj.lora_A.weight"));

  std::ifstream in(dir.file("a/adapter_config.json"));
  const nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c["target_modules"], nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "up_proj",
                                                 "down_proj"}));
  EXPECT_EQ(c["target_parameters"], nlohmann::json({"mixer.experts.up_proj", "mixer.experts.down_proj"}));
  EXPECT_EQ(c["modules_to_save"], nlohmann::json({"gate"}));

  LoraConfig back_config = lora_config_read(dir.file("a"), s);
  EXPECT_EQ(back_config.target, kAllTargets);
  CausalLM fresh = load_fp32();
  const LoraWeights back = lora_load_pretrained(dir.file("a"), s, fresh.weights);
  const auto na = l.named_parameters(), nb = back.named_parameters();
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(na[i].first, nb[i].first);
    EXPECT_EQ(na[i].second->to_floats(), nb[i].second->to_floats()) << na[i].first;
  }

  // A PEFT config naming the Mamba2 projection alone reads as that target.
  io_test::ScratchDir d2;
  auto only = std::make_shared<const LoraTable>(lora_table_of(s, config_of({"in_proj"}), "test"));
  lora_save_pretrained(d2.file("b"), s, random_adapter(only, s.num_layers(), 6), lm.weights, "nvidia/x");
  EXPECT_EQ(lora_config_read(d2.file("b"), s).target, (std::vector<std::string>{"in_proj"}));
}

// PEFT's _check_lora_target_modules_mamba rejects LoRA on out_proj and conv1d of nemotron_h models (peft 0.21 on
// the GPU machine: "Module 'out_proj' is incompatible with Mamba-based models"), so an adapter holding one would not
// load there: a recipe naming out_proj and an adapter config listing it are one-line errors that say so.
TEST(NemotronHLora, OutProjIsRefusedAsPeftRefusesIt) {
  CausalLM lm = load_fp32();
  const DecoderSpec& s = lm.config;
  try {
    lora_table_of(s, config_of({"in_proj", "out_proj"}), "r.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("r.yaml: peft.target: 'out_proj': PEFT refuses LoRA on the Mamba2 mixer's out_proj", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  // Unknown-target errors list what is taken, without out_proj.
  try {
    lora_table_of(s, config_of({"conv1d"}), "r.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'conv1d' is not a LoRA target of nemotron_h models (known: q_proj, k_proj, v_proj, o_proj, "
                     "in_proj, up_proj, down_proj, experts, router)"),
              std::string::npos)
        << m;
  }
  io_test::ScratchDir d;
  auto only = std::make_shared<const LoraTable>(lora_table_of(s, config_of({"in_proj"}), "test"));
  lora_save_pretrained(d.file("a"), s, random_adapter(only, s.num_layers(), 6), lm.weights, "nvidia/x");
  std::ifstream in(d.file("a/adapter_config.json"));
  nlohmann::json c = nlohmann::json::parse(in);
  c["target_modules"] = {"in_proj", "out_proj"};
  std::ofstream(d.file("a/adapter_config.json")) << c.dump(2);
  try {
    lora_config_read(d.file("a"), s);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target_modules: 'out_proj': PEFT refuses LoRA"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mt
