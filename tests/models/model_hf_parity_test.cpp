// The CPU model against Transformers 5.17 (tests/fixtures/qwen3_moe, produced on the GPU machine):
// fp32 logits, losses and every parameter gradient; bf16 losses and logits within bf16 tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"
#include "models/qwen3_moe_config.h"
#include "models/qwen3_moe_model.h"
#include "models/qwen3_moe_weights.h"

namespace mt {
namespace {

const std::string kDir = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/";

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  // Python's json writes Infinity; nlohmann does not read it.
  for (size_t p; (p = s.find("Infinity")) != std::string::npos;) s.replace(p, 8, "null");
  return nlohmann::json::parse(s);
}

Qwen3MoeWeights load_ckpt(const std::string& dir, const Qwen3MoeConfig& cfg, DType dtype) {
  auto index = read_json(dir + "/model.safetensors.index.json");
  std::map<std::string, SafetensorsFile> files;
  std::vector<std::string> names;
  for (auto& [name, file] : index["weight_map"].items()) {
    const std::string f = file.get<std::string>();
    if (!files.count(f)) files.emplace(f, SafetensorsFile::open(dir + "/" + f));
    names.push_back(name);
  }
  auto lookup = [&](const std::string& n) {
    for (auto& [f, st] : files)
      if (st.has(n)) return st.tensor(n).clone();
    return Tensor();
  };
  return Qwen3MoeWeights::from_hf(cfg, dtype, lookup, names, dir);
}

// aux_loss is null in the fixtures when the model computes none; the model reports 0 then.
double aux_of(const nlohmann::json& j) { return j["aux_loss"].is_null() ? 0.0 : j["aux_loss"].get<double>(); }

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, (double)std::fabs(v));
  return m;
}

// max |a − b| relative to max |b|.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) e = std::max(e, (double)std::fabs(a[i] - b[i]));
  return e / std::max(max_abs(b), 1e-30);
}

void check_variant(const std::string& variant) {
  SCOPED_TRACE(variant);
  const std::string dir = kDir + variant;
  Qwen3MoeConfig cfg = Qwen3MoeConfig::from_file(dir + "/ckpt/config.json");
  auto meta = read_json(dir + "/meta.json");
  Qwen3MoeWeights w32 = load_ckpt(dir + "/ckpt", cfg, DType::F32);
  Qwen3MoeWeights w16 = load_ckpt(dir + "/ckpt", cfg, DType::BF16);
  // The fixtures ran with use_cache = true: HF applied no packed-document mask (see ModelOptions).
  ModelOptions hf_cache_on;
  hf_cache_on.packed_document_mask = false;
  Qwen3MoeModel m32(cfg, w32, hf_cache_on), m16(cfg, w16, hf_cache_on);
  for (const std::string batch : {"plain", "packed", "packed2"}) {
    SCOPED_TRACE(batch);
    auto st = SafetensorsFile::open(dir + "/" + batch + ".safetensors");
    Batch b{st.tensor("input_ids").clone(), st.tensor("labels").clone(),
            st.has("position_ids") ? st.tensor("position_ids").clone() : Tensor()};
    const auto& f32m = meta["batches"][batch]["fp32"];
    ForwardResult r = m32.forward(b, true);
    EXPECT_NEAR(r.loss, f32m["loss"].get<double>(), 2e-5 * std::fabs(f32m["loss"].get<double>()));
    EXPECT_NEAR(r.ce_loss, f32m["ce_loss"].get<double>(), 2e-5 * f32m["ce_loss"].get<double>());
    EXPECT_NEAR(r.aux_loss, aux_of(f32m), 2e-5 * std::max(1.0, aux_of(f32m)));
    EXPECT_EQ(r.tokens, f32m["tokens"].get<int64_t>());
    EXPECT_LT(rel_err(r.logits.to_floats(), st.tensor("logits").to_floats()), 1e-5);

    Qwen3MoeWeights g = Qwen3MoeWeights::zeros_like_config(cfg, DType::F32);
    ForwardResult rb = m32.forward_backward(b, g);
    EXPECT_NEAR(rb.loss, r.loss, 1e-6 * std::fabs(r.loss));
    for (auto& [name, t] : g.named_parameters()) {
      ASSERT_TRUE(st.has("grad." + name)) << name;
      const double e = rel_err(t->to_floats(), st.tensor("grad." + name).to_floats());
      EXPECT_LT(e, 1e-4) << "grad of " << name;
    }

    const auto& b16 = meta["batches"][batch]["bf16"];
    ForwardResult r16 = m16.forward(b, batch == "plain");
    EXPECT_NEAR(r16.loss, b16["loss"].get<double>(), 1e-2 * b16["loss"].get<double>());
    EXPECT_NEAR(r16.ce_loss, b16["ce_loss"].get<double>(), 1e-2 * b16["ce_loss"].get<double>());
    EXPECT_NEAR(r16.aux_loss, aux_of(b16), 1e-2 * std::max(1.0, aux_of(b16)));
    if (batch == "plain") {
      auto want = SafetensorsFile::open(dir + "/plain_bf16_logits.safetensors").tensor("logits").to_floats();
      EXPECT_LT(rel_err(r16.logits.to_floats(), want), 3e-2);
    }
  }
}

TEST(ModelHfParity, MoeGqaAux) { check_variant("moe_gqa_aux"); }
TEST(ModelHfParity, MoeMhaTiedSparse2) { check_variant("moe_mha_tied_sparse2"); }
TEST(ModelHfParity, MoeMqaLegacy) { check_variant("moe_mqa_legacy"); }
TEST(ModelHfParity, DenseQwen3) { check_variant("dense_qwen3"); }

}  // namespace
}  // namespace mt
