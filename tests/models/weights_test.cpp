#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>

#include "../io/io_test_util.h"
#include "../train/fixture_tensors.h"
#include "core/error.h"
#include "core/float_convert.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint_map.h"
#include "models/model_weights.h"

namespace mt {
namespace {

using nlohmann::json;
using test::tensor_bytes_equal;

// 2 layers: layer 0 MoE (3 experts), layer 1 dense via mlp_only_layers.
DecoderSpec tiny_config(bool tied) {
  json j = {{"architectures", {"Qwen3MoeForCausalLM"}},
            {"vocab_size", 32},
            {"hidden_size", 8},
            {"intermediate_size", 6},
            {"moe_intermediate_size", 4},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 2},
            {"num_key_value_heads", 1},
            {"head_dim", 4},
            {"num_experts", 3},
            {"num_experts_per_tok", 2},
            {"mlp_only_layers", {1}},
            {"initializer_range", 0.5},
            {"tie_word_embeddings", tied}};
  return DecoderSpec::from_json(j, "tiny.json");
}

using HfMap = std::map<std::string, Tensor>;

HfMap to_map(const std::vector<std::pair<std::string, Tensor>>& v) {
  HfMap m;
  for (const auto& [n, t] : v) m[n] = t.clone();
  return m;
}

std::vector<std::string> names_of(const HfMap& m) {
  std::vector<std::string> r;
  for (const auto& [n, t] : m) r.push_back(n);
  return r;
}

ModelWeights load(const DecoderSpec& cfg, const HfMap& m, DType dtype = DType::F32,
                     const std::string& source = "ckpt/") {
  auto lookup = [&](const std::string& n) {
    auto it = m.find(n);
    return it == m.end() ? Tensor() : it->second;
  };
  return ModelWeights::from_hf(cfg, dtype, lookup, names_of(m), source);
}

void expect_load_error(const DecoderSpec& cfg, const HfMap& m, const std::vector<std::string>& parts) {
  try {
    load(cfg, m);
    ADD_FAILURE() << "no error, expected " << parts[0];
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("ckpt/: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << "\n  missing: " << p;
  }
}

TEST(ModelWeights, NamedParametersOrderAndShapes) {
  ModelWeights w = ModelWeights::zeros_like_config(tiny_config(false), DType::F32);
  std::vector<std::pair<std::string, Shape>> expect = {
      {"model.embed_tokens.weight", {32, 8}},
      {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
      {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.o_proj.weight", {8, 8}},
      {"model.layers.0.self_attn.q_norm.weight", {4}},
      {"model.layers.0.self_attn.k_norm.weight", {4}},
      {"model.layers.0.mlp.gate.weight", {3, 8}},
      {"model.layers.0.mlp.experts.gate_up_proj", {3, 8, 8}},
      {"model.layers.0.mlp.experts.down_proj", {3, 8, 4}},
      {"model.layers.0.input_layernorm.weight", {8}},
      {"model.layers.0.post_attention_layernorm.weight", {8}},
      {"model.layers.1.self_attn.q_proj.weight", {8, 8}},
      {"model.layers.1.self_attn.k_proj.weight", {4, 8}},
      {"model.layers.1.self_attn.v_proj.weight", {4, 8}},
      {"model.layers.1.self_attn.o_proj.weight", {8, 8}},
      {"model.layers.1.self_attn.q_norm.weight", {4}},
      {"model.layers.1.self_attn.k_norm.weight", {4}},
      {"model.layers.1.mlp.gate_proj.weight", {6, 8}},
      {"model.layers.1.mlp.up_proj.weight", {6, 8}},
      {"model.layers.1.mlp.down_proj.weight", {8, 6}},
      {"model.layers.1.input_layernorm.weight", {8}},
      {"model.layers.1.post_attention_layernorm.weight", {8}},
      {"model.norm.weight", {8}},
      {"lm_head.weight", {32, 8}},
  };
  auto got = w.named_parameters();
  ASSERT_EQ(got.size(), expect.size());
  int64_t total = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, expect[i].first);
    EXPECT_EQ(got[i].second->shape(), expect[i].second) << got[i].first;
    for (float x : got[i].second->to_floats()) ASSERT_EQ(x, 0.0f);
    total += shape_numel(expect[i].second);
  }
  EXPECT_EQ(w.parameter_count(), total);
  // Hand count: embed 256 + lm_head 256 + norm 8; per layer attention 64+32+32+64+4+4 + norms 16;
  // MoE mlp 24 + 192 + 96; dense mlp 48 * 3.
  EXPECT_EQ(total, 256 + 256 + 8 + 2 * (200 + 16) + (24 + 192 + 96) + 144);
  ModelWeights tied = ModelWeights::zeros_like_config(tiny_config(true), DType::BF16);
  EXPECT_FALSE(tied.lm_head.defined());
  EXPECT_EQ(tied.named_parameters().back().first, "model.norm.weight");
  EXPECT_EQ(tied.parameter_count(), total - 256);
  EXPECT_EQ(tied.embed.dtype(), DType::BF16);
}

TEST(ModelWeights, RandomInit) {
  const DecoderSpec cfg = tiny_config(false);
  ModelWeights a = ModelWeights::random_init(cfg, DType::F32, 42);
  ModelWeights b = ModelWeights::random_init(cfg, DType::F32, 42);
  ModelWeights c = ModelWeights::random_init(cfg, DType::F32, 43);
  ModelWeights h = ModelWeights::random_init(cfg, DType::BF16, 42);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters(), ph = h.named_parameters();
  double sum = 0, sumsq = 0;
  int64_t n = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::string& name = pa[i].first;
    EXPECT_TRUE(tensor_bytes_equal(*pa[i].second, *pb[i].second)) << name;
    std::vector<float> va = pa[i].second->to_floats(), vc = pc[i].second->to_floats(), vh = ph[i].second->to_floats();
    const bool norm = name.find("norm") != std::string::npos;
    for (size_t k = 0; k < va.size(); ++k) {
      if (norm) {
        ASSERT_EQ(va[k], 1.0f) << name;
      } else {
        sum += va[k];
        sumsq += double(va[k]) * va[k];
        ++n;
      }
      ASSERT_EQ(vh[k], round_bf16(va[k])) << name;  // bf16 init = RNE of the same draws
    }
    if (!norm) {
      EXPECT_NE(va, vc) << name;  // the seed matters
    }
  }
  // Embedding and lm_head, and each expert tensor, draw from different streams.
  EXPECT_NE(a.embed.to_floats(), a.lm_head.to_floats());
  const double mean = sum / n, std = std::sqrt(sumsq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(std, 0.5, 0.03);  // initializer_range
}

TEST(ModelWeights, RoundTripByteIdentical) {
  for (bool tied : {false, true}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      const DecoderSpec cfg = tiny_config(tied);
      ModelWeights w = ModelWeights::random_init(cfg, dt, 7);
      auto hf = w.to_hf(cfg);
      EXPECT_EQ(hf.size(), 1 + 2 * 8 + 1 + 3 * 3 + 3 + 1 + (tied ? 0 : 1));
      HfMap m = to_map(hf);
      EXPECT_EQ(m.size(), hf.size());  // no duplicate names
      EXPECT_EQ(m.count("lm_head.weight"), tied ? 0u : 1u);
      ModelWeights back = load(cfg, m, dt);
      auto p1 = w.named_parameters(), p2 = back.named_parameters();
      ASSERT_EQ(p1.size(), p2.size());
      for (size_t i = 0; i < p1.size(); ++i) {
        EXPECT_EQ(p1[i].first, p2[i].first);
        EXPECT_TRUE(tensor_bytes_equal(*p1[i].second, *p2[i].second)) << p1[i].first;
      }
      // Loaded parameters are owned copies, not views of the checkpoint tensors.
      EXPECT_NE(back.embed.storage(), m.at("model.embed_tokens.weight").storage());
      auto hf2 = back.to_hf(cfg);
      ASSERT_EQ(hf.size(), hf2.size());
      for (size_t i = 0; i < hf.size(); ++i) {
        EXPECT_EQ(hf[i].first, hf2[i].first);
        EXPECT_TRUE(tensor_bytes_equal(hf[i].second, hf2[i].second)) << hf[i].first;
      }
    }
  }
}

TEST(ModelWeights, ToHfOrder) {
  // Transformers 5.17 writes a qwen3_moe checkpoint in sorted in-memory name order with each
  // fused expert tensor expanded in place: downs, then gates, then ups (see FixtureShardOrder).
  const DecoderSpec cfg = tiny_config(false);
  auto hf = ModelWeights::zeros_like_config(cfg, DType::F32).to_hf(cfg);
  std::vector<std::string> names;
  for (const auto& [n, t] : hf) names.push_back(n);
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  std::vector<std::string> expect = {"lm_head.weight", "model.embed_tokens.weight", l0 + "input_layernorm.weight"};
  for (const char* k : {"down", "gate", "up"})
    for (int e = 0; e < 3; ++e) expect.push_back(l0 + "mlp.experts." + std::to_string(e) + "." + k + "_proj.weight");
  for (const char* n : {"mlp.gate.weight", "post_attention_layernorm.weight", "self_attn.k_norm.weight",
                        "self_attn.k_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                        "self_attn.q_proj.weight", "self_attn.v_proj.weight"})
    expect.push_back(l0 + n);
  for (const char* n : {"input_layernorm.weight", "mlp.down_proj.weight", "mlp.gate_proj.weight",
                        "mlp.up_proj.weight", "post_attention_layernorm.weight", "self_attn.k_norm.weight",
                        "self_attn.k_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                        "self_attn.q_proj.weight", "self_attn.v_proj.weight"})
    expect.push_back(l1 + n);
  expect.push_back("model.norm.weight");
  EXPECT_EQ(names, expect);
}

TEST(ModelWeights, StackedLayoutGateRowsFirst) {
  const DecoderSpec cfg = tiny_config(false);
  HfMap m = to_map(ModelWeights::zeros_like_config(cfg, DType::F32).to_hf(cfg));
  const int64_t I = 4, H = 8;
  auto value = [](int kind, int64_t e, int64_t r, int64_t c) { return float(kind * 1000 + e * 100 + r * 10 + c); };
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<float> g(I * H), u(I * H), d(H * I);
    for (int64_t r = 0; r < I; ++r)
      for (int64_t c = 0; c < H; ++c) g[r * H + c] = value(1, e, r, c), u[r * H + c] = value(2, e, r, c);
    for (int64_t r = 0; r < H; ++r)
      for (int64_t c = 0; c < I; ++c) d[r * I + c] = value(3, e, r, c);
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    m[p + "gate_proj.weight"] = Tensor::from_floats({I, H}, g);
    m[p + "up_proj.weight"] = Tensor::from_floats({I, H}, u);
    m[p + "down_proj.weight"] = Tensor::from_floats({H, I}, d);
  }
  ModelWeights w = load(cfg, m);
  const Tensor& gu = w.layers[0].experts_gate_up;
  ASSERT_EQ(gu.shape(), (Shape{3, 2 * I, H}));
  std::vector<float> v = gu.to_floats(), dv = w.layers[0].experts_down.to_floats();
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t r = 0; r < 2 * I; ++r)
      for (int64_t c = 0; c < H; ++c)
        ASSERT_EQ(v[(e * 2 * I + r) * H + c], r < I ? value(1, e, r, c) : value(2, e, r - I, c)) << e << " " << r;
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t r = 0; r < H; ++r)
      for (int64_t c = 0; c < I; ++c) ASSERT_EQ(dv[(e * H + r) * I + c], value(3, e, r, c));

  // The same tensors under the fused v5 names (save_original_format=False) load identically.
  HfMap fused = m;
  for (int64_t e = 0; e < 3; ++e)
    for (const char* k : {"gate", "up", "down"})
      fused.erase("model.layers.0.mlp.experts." + std::to_string(e) + "." + k + "_proj.weight");
  fused["model.layers.0.mlp.experts.gate_up_proj"] = gu.clone();
  fused["model.layers.0.mlp.experts.down_proj"] = w.layers[0].experts_down.clone();
  ModelWeights wf = load(cfg, fused);
  EXPECT_TRUE(tensor_bytes_equal(wf.layers[0].experts_gate_up, gu));
  EXPECT_TRUE(tensor_bytes_equal(wf.layers[0].experts_down, w.layers[0].experts_down));
}

TEST(ModelWeights, DtypeConversion) {
  const DecoderSpec cfg = tiny_config(true);
  ModelWeights w32 = ModelWeights::random_init(cfg, DType::F32, 3);
  HfMap m = to_map(w32.to_hf(cfg));
  ModelWeights w16 = load(cfg, m, DType::BF16);
  std::vector<float> a = w32.layers[0].experts_gate_up.to_floats(), b = w16.layers[0].experts_gate_up.to_floats();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(b[i], round_bf16(a[i]));
  EXPECT_EQ(w16.embed.dtype(), DType::BF16);
  // A BF16 checkpoint loads into F32 exactly.
  HfMap m16 = to_map(w16.to_hf(cfg));
  ModelWeights back = load(cfg, m16, DType::F32);
  EXPECT_EQ(back.embed.to_floats(), w16.embed.to_floats());
  EXPECT_THROW(load(cfg, m, DType::I32), Error);
}

TEST(ModelWeights, TiedHeadStoredIsIgnored) {
  const DecoderSpec cfg = tiny_config(true);
  HfMap m = to_map(ModelWeights::random_init(cfg, DType::F32, 1).to_hf(cfg));
  m["lm_head.weight"] = Tensor::zeros({32, 8}, DType::F32);  // HF drops it for a tied model
  ModelWeights w = load(cfg, m);
  EXPECT_FALSE(w.lm_head.defined());
}

TEST(ModelWeights, Errors) {
  const DecoderSpec cfg = tiny_config(false);
  const HfMap good = to_map(ModelWeights::random_init(cfg, DType::F32, 1).to_hf(cfg));
  HfMap m = good;
  m.erase("model.layers.0.mlp.experts.2.up_proj.weight");
  expect_load_error(cfg, m, {"'model.layers.0.mlp.experts.2.up_proj.weight'", "missing", "[4, 8]"});
  m = good;
  m.erase("lm_head.weight");
  expect_load_error(cfg, m, {"'lm_head.weight'", "missing"});
  m = good;
  m.erase("model.layers.1.mlp.down_proj.weight");
  expect_load_error(cfg, m, {"'model.layers.1.mlp.down_proj.weight'", "missing"});
  m = good;
  m["model.layers.0.self_attn.k_proj.weight"] = Tensor::zeros({8, 8}, DType::F32);
  expect_load_error(cfg, m,
                    {"'model.layers.0.self_attn.k_proj.weight'", "wrong shape (expected [4, 8], found [8, 8])"});
  m = good;
  m["model.layers.0.mlp.experts.1.down_proj.weight"] = Tensor::zeros({4, 8}, DType::F32);  // transposed
  expect_load_error(cfg, m, {"experts.1.down_proj.weight", "expected [8, 4], found [4, 8]"});
  m = good;
  m["model.norm.weight"] = Tensor::zeros({8}, DType::I32);
  expect_load_error(cfg, m, {"'model.norm.weight'", "wrong dtype", "found I32"});
  m = good;
  for (int e = 0; e < 3; ++e)  // the fused form instead of the per-expert one, wrongly shaped
    for (const char* w : {"gate_proj", "up_proj"}) m.erase(fmt::format("model.layers.0.mlp.experts.{}.{}.weight", e, w));
  m["model.layers.0.mlp.experts.gate_up_proj"] = Tensor::zeros({3, 7, 8}, DType::F32);
  expect_load_error(cfg, m, {"'model.layers.0.mlp.experts.gate_up_proj'", "expected [3, 8, 8], found [3, 7, 8]"});
  m = good;
  m["model.layers.0.mlp.experts.gate_up_proj"] = Tensor::zeros({3, 8, 8}, DType::F32);  // both forms stored
  expect_load_error(cfg, m, {"'model.layers.0.mlp.experts.gate_up_proj'", "two forms of one parameter"});
  m = good;
  for (int i = 0; i < 7; ++i) m["extra." + std::to_string(i)] = Tensor::zeros({1}, DType::F32);
  m["model.layers.0.mlp.experts.3.up_proj.weight"] = Tensor::zeros({4, 8}, DType::F32);  // beyond E
  expect_load_error(cfg, m, {"unexpected tensor 'extra.0'", "7 more: extra.1, extra.2, extra.3, extra.4, ..."});
  m = good;
  m["model.layers.1.mlp.experts.0.up_proj.weight"] = Tensor::zeros({4, 8}, DType::F32);  // experts in a dense layer
  expect_load_error(cfg, m, {"unexpected tensor 'model.layers.1.mlp.experts.0.up_proj.weight'"});
  EXPECT_NO_THROW(load(cfg, good));
}

// Memory that faults on any access: a tensor the loader must not read.
Tensor no_access_tensor(const Shape& shape, DType dtype) {
  size_t bytes = dtype_size(dtype);
  for (int64_t d : shape) bytes *= static_cast<size_t>(d);
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
  std::shared_ptr<void> keep(p, [bytes](void* q) { ::munmap(q, bytes); });
  return Tensor::from_storage(Storage::borrow(p, bytes, Device::cpu(), keep), 0, shape, dtype);
}

// A checkpoint of w as a name -> tensor map: the fused v5 stacks as they are, or the per-expert HF tensors with
// those of the experts in `unread` made inaccessible memory (a read of them crashes the test).
HfMap expert_checkpoint(const ModelWeights& w, const DecoderSpec& cfg, bool fused, const std::vector<int>& unread) {
  HfMap m;
  if (fused) {
    for (const auto& [n, t] : w.named_parameters()) m[n] = t->clone();
    return m;
  }
  m = to_map(w.to_hf(cfg));
  for (auto& [n, t] : m)
    for (int e : unread)
      if (n.find("experts." + std::to_string(e) + ".") != std::string::npos) t = no_access_tensor(t.shape(), t.dtype());
  return m;
}

Tensor find_or_empty(const HfMap& m, const std::string& n) {
  auto it = m.find(n);
  return it == m.end() ? Tensor() : it->second;
}

// An expert-parallel rank's load: only experts [first, first + count) are read and copied, for per-expert HF
// tensors (the others are inaccessible memory here: touching them would crash the test) and the fused v5
// ones; every other parameter loads in full. A CausalLM loaded so refuses to be saved.
TEST(ModelWeights, LoadsOnlyItsShareOfTheExperts) {
  const DecoderSpec cfg = tiny_config(false);
  const ModelWeights w = ModelWeights::random_init(cfg, DType::F32, 11);
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "per-expert");
    const HfMap m = expert_checkpoint(w, cfg, fused, {0, 2});
    auto lookup = [&](const std::string& n) { return find_or_empty(m, n); };
    const ModelWeights got = ModelWeights::from_hf(cfg, DType::F32, lookup, names_of(m), "ckpt/", 1, 1);
    const auto want = w.named_parameters(), have = got.named_parameters();
    ASSERT_EQ(want.size(), have.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string& n = want[i].first;
      if (w.param_table().is_expert_stack(n))
        EXPECT_TRUE(tensor_bytes_equal((*want[i].second)[1], (*have[i].second)[1])) << n;
      else
        EXPECT_TRUE(tensor_bytes_equal(*want[i].second, *have[i].second)) << n;
    }
    EXPECT_THROW(ModelWeights::from_hf(cfg, DType::F32, lookup, names_of(m), "ckpt/", 2, 2), Error);
  }

  io_test::ScratchDir dir;
  CausalLM full = CausalLM::from_config(cfg, DType::F32, 3);
  full.save_pretrained(dir.file("model"));
  LoadOptions lo;
  lo.expert_first = 2;
  lo.expert_count = 1;
  CausalLM part = CausalLM::from_pretrained(dir.file("model"), lo);
  EXPECT_TRUE(part.experts_partial);
  EXPECT_TRUE(tensor_bytes_equal(full.weights.layers[0].experts_down[2], part.weights.layers[0].experts_down[2]));
  try {
    part.save_pretrained(dir.file("again"));
    ADD_FAILURE() << "a partially loaded model was saved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot save a model loaded with only some of its experts"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("again")));
  lo.expert_count = -1;
  EXPECT_FALSE(CausalLM::from_pretrained(dir.file("model"), lo).experts_partial);
}

// The CPU engine's expert-parallel load (LoadOptions::compact_experts): the stacks hold just the rank's experts
// ([count, ...], the checkpoint's rows of those experts; the others never read), to_hf still names every expert
// (the others shape-only), and two such models, each writing its own experts' rows and one of them the rest,
// make together the files one save of the whole model writes, byte for byte.
TEST(ModelWeights, CompactExpertsHoldOnlyTheirShare) {
  const DecoderSpec cfg = tiny_config(false);
  const ModelWeights w = ModelWeights::random_init(cfg, DType::F32, 11);
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "per-expert");
    const HfMap m = expert_checkpoint(w, cfg, fused, {0});
    auto lookup = [&](const std::string& n) { return find_or_empty(m, n); };
    const ModelWeights got =
        ModelWeights::from_hf(cfg, DType::F32, lookup, names_of(m), "ckpt/", 1, 2, {}, /*compact_experts=*/true);
    const auto want = w.named_parameters(), have = got.named_parameters();
    ASSERT_EQ(want.size(), have.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string& n = want[i].first;
      if (w.param_table().is_expert_stack(n)) {
        ASSERT_EQ(have[i].second->dim(0), 2) << n;
        EXPECT_TRUE(tensor_bytes_equal(want[i].second->rows(1, 3), *have[i].second)) << n;
      } else {
        EXPECT_TRUE(tensor_bytes_equal(*want[i].second, *have[i].second)) << n;
      }
    }
    const HfMap hf = [&] {
      HfMap r;
      for (const auto& [n, t] : got.to_hf(cfg, 1)) r[n] = t;
      return r;
    }();
    EXPECT_EQ(names_of(hf), names_of(to_map(w.to_hf(cfg))));
    for (const auto& [n, t] : to_map(w.to_hf(cfg))) {
      const Tensor& h = hf.at(n);
      EXPECT_EQ(h.shape(), t.shape()) << n;
      if (n.find("experts.0.") != std::string::npos) {
        EXPECT_FALSE(h.present()) << n;
      } else {
        EXPECT_TRUE(tensor_bytes_equal(h, t)) << n;
      }
    }
  }

  io_test::ScratchDir dir;
  CausalLM full = CausalLM::from_config(cfg, DType::F32, 3);
  full.save_pretrained(dir.file("model"), {.max_shard_bytes = 1000});  // several shards
  CausalLM parts[2];
  const int64_t first[2] = {0, 1}, count[2] = {1, 2};
  for (int i = 0; i < 2; ++i) {
    LoadOptions lo;
    lo.expert_first = first[i];
    lo.expert_count = count[i];
    lo.compact_experts = true;
    parts[i] = CausalLM::from_pretrained(dir.file("model"), lo);
    EXPECT_TRUE(parts[i].experts_partial);
    EXPECT_EQ(parts[i].expert_first, first[i]);
    EXPECT_EQ(parts[i].weights.layers[0].experts_gate_up.dim(0), count[i]);
  }
  std::filesystem::create_directories(dir.file("shared"));
  parts[1].write_pretrained_layout(dir.file("shared"));
  std::map<std::string, int64_t> expert_of;  // the checkpoint map's expert of each per-expert tensor, else -1
  for (const HfSavedSource& s : hf_name_map_of(cfg, full.weights.param_table(), full.dtype).saved_sources())
    expert_of[s.name] = s.expert;
  for (int i = 0; i < 2; ++i)
    parts[i].write_pretrained_rows(dir.file("shared"), [&](const std::string& n, const Tensor& t) {
      const int64_t e = expert_of.at(n);
      const bool mine = e < 0 ? i == 0 : e >= first[i] && e < first[i] + count[i];
      return mine ? std::pair<int64_t, int64_t>{0, t.ndim() == 0 ? 1 : t.dim(0)} : std::pair<int64_t, int64_t>{0, 0};
    });
  size_t files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.file("model"))) {
    if (f.path().extension() != ".safetensors" && f.path().extension() != ".json") continue;
    EXPECT_EQ(io_test::read_bytes(f.path().string()),
              io_test::read_bytes(dir.file("shared") + "/" + f.path().filename().string()))
        << f.path().filename();
    ++files;
  }
  EXPECT_GT(files, 3u);
}

// ZeRO-3's load (LoadOptions::skip_param): the skipped parameters are absent (no storage; shape and dtype kept)
// and never read (their checkpoint tensors are inaccessible memory here), every other one holds the
// checkpoint's bytes; a skipped tensor is still checked (a missing one is an error); a CausalLM loaded so
// refuses a plain save.
TEST(ModelWeights, SkippedParametersAreCheckedButNotRead) {
  const DecoderSpec cfg = tiny_config(false);
  const ModelWeights w = ModelWeights::random_init(cfg, DType::F32, 13);
  auto skipped = [](const std::string& n) {
    return n == "model.embed_tokens.weight" || n.find("layers.0.self_attn") != std::string::npos;
  };
  HfMap m = to_map(w.to_hf(cfg));
  for (auto& [n, t] : m)
    if (skipped(n)) t = no_access_tensor(t.shape(), t.dtype());
  auto lookup = [&](const std::string& n) {
    auto it = m.find(n);
    return it == m.end() ? Tensor() : it->second;
  };
  const ModelWeights got = ModelWeights::from_hf(cfg, DType::F32, lookup, names_of(m), "ckpt/", 0, -1, skipped);
  const auto want = w.named_parameters(), have = got.named_parameters();
  ASSERT_EQ(want.size(), have.size());
  int absent = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string& n = want[i].first;
    EXPECT_EQ(have[i].second->shape(), want[i].second->shape()) << n;
    EXPECT_EQ(have[i].second->dtype(), DType::F32) << n;
    if (skipped(n)) {
      EXPECT_FALSE(have[i].second->present()) << n;
      ++absent;
    } else {
      EXPECT_TRUE(tensor_bytes_equal(*want[i].second, *have[i].second)) << n;
    }
  }
  EXPECT_EQ(absent, 7);  // the embedding; layer 0's q, k, v, o projections and q, k norms
  m.erase("model.embed_tokens.weight");
  EXPECT_THROW(ModelWeights::from_hf(cfg, DType::F32, lookup, names_of(m), "ckpt/", 0, -1, skipped), Error);

  io_test::ScratchDir dir;
  CausalLM full = CausalLM::from_config(cfg, DType::F32, 5);
  full.save_pretrained(dir.file("model"));
  LoadOptions lo;
  lo.skip_param = skipped;
  CausalLM part = CausalLM::from_pretrained(dir.file("model"), lo);
  EXPECT_TRUE(part.params_partial);
  EXPECT_FALSE(part.weights.embed.present());
  EXPECT_TRUE(tensor_bytes_equal(full.weights.final_norm, part.weights.final_norm));
  try {
    part.save_pretrained(dir.file("again"));
    ADD_FAILURE() << "a partially loaded model was saved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot save a model loaded without some of its parameters"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("again")));
}

// Against the checkpoints Transformers 5.17 wrote (tests/fixtures): loads, writes back the exact
// bytes, and emits names in the order save_pretrained sharded them.
TEST(ModelWeights, FixtureCheckpoints) {
  const std::string root = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/";
  for (const char* variant : {"moe_gqa_aux/ckpt", "moe_gqa_aux/ckpt_bf16", "moe_mha_tied_sparse2/ckpt",
                              "moe_mqa_legacy/ckpt", "dense_qwen3/ckpt", "train5/final"}) {
    SCOPED_TRACE(variant);
    const std::string dir = root + variant;
    const DecoderSpec cfg = DecoderSpec::from_file(dir + "/config.json");
    test::FixtureCheckpoint ck = test::fixture_checkpoint_read(dir);
    const DType dt = ck.tensors.at("model.embed_tokens.weight").dtype();
    ModelWeights w = load(cfg, ck.tensors, dt, dir);
    auto hf = w.to_hf(cfg);
    ASSERT_EQ(hf.size(), ck.tensors.size());
    std::string prev_shard;
    for (const auto& [name, t] : hf) {
      ASSERT_TRUE(ck.tensors.count(name)) << name;
      EXPECT_TRUE(tensor_bytes_equal(t, ck.tensors.at(name))) << name;
      // Greedy sharding fills shards in emission order, so shard files never go backwards.
      const std::string& shard = ck.shard_of.at(name);
      EXPECT_GE(shard, prev_shard) << name;
      prev_shard = shard;
    }
  }
}

}  // namespace
}  // namespace mt
