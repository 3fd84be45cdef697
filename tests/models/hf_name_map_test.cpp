// The rule ops one by one, and the GPT-OSS, DeepSeek-V3 and Nemotron-H layouts as rule lists on tiny synthetic
// checkpoints: load∘save and save∘load are the identity (bytes, names, order), and each op puts every element
// where Transformers' layout says (checked element by element against index formulas written here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "../io/io_test_util.h"
#include "hf_rules_test_util.h"
#include "io/dequant.h"
#include "models/spec/tensor_rearrange.h"

namespace mt {
namespace {

using hf_test::bytes_equal;
using hf_test::FakeCheckpoint;
using hf_test::pattern_tensor;

uint16_t bf16_at(const Tensor& t, int64_t i) { return t.data_as<uint16_t>()[i]; }

// save(load(c)) == c: same names in the same order, same bytes.
void expect_save_reproduces(const HfNameMap& map, const FakeCheckpoint& c, const std::vector<std::string>& dropped = {}) {
  const auto saved = map.save(map.load(c.view()));
  std::vector<std::pair<std::string, Tensor>> want;
  for (const auto& [n, t] : c.tensors)
    if (std::find(dropped.begin(), dropped.end(), n) == dropped.end()) want.emplace_back(n, t);
  ASSERT_EQ(saved.size(), want.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(saved[i].first, want[i].first) << i;
    EXPECT_TRUE(bytes_equal(saved[i].second, want[i].second)) << saved[i].first;
  }
}

// load(save(v)) == v.
void expect_load_reproduces(const HfNameMap& map, const std::vector<Tensor>& v) {
  const FakeCheckpoint c = hf_test::saved_checkpoint(map, v);
  const std::vector<Tensor> back = map.load(c.view());
  ASSERT_EQ(back.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_TRUE(bytes_equal(back[i], v[i])) << map.params()[i].name;
}

TEST(TensorRearrange, TransposeDeinterleaveAndBoxes) {
  // [2, 2, 3] → [2, 3, 2]
  Tensor in = Tensor::from_floats({2, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor t = Tensor::empty({2, 3, 2}, DType::F32);
  transpose_last2_into(in, t);
  EXPECT_EQ(t.to_floats(), (std::vector<float>{0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11}));
  // along dim 1 of [1, 4, 2]: rows g0 u0 g1 u1 → g0 g1 u0 u1
  Tensor r = Tensor::from_floats({1, 4, 2}, {0, 1, 10, 11, 2, 3, 12, 13});
  Tensor d = Tensor::empty({1, 4, 2}, DType::F32), back = Tensor::empty({1, 4, 2}, DType::F32);
  deinterleave_into(r, 1, d);
  EXPECT_EQ(d.to_floats(), (std::vector<float>{0, 1, 2, 3, 10, 11, 12, 13}));
  interleave_into(d, 1, back);
  EXPECT_TRUE(bytes_equal(back, r));
  // A box: expert 1's gate half of [2, 4, 2] is contiguous; the gate half of every expert is not.
  const Box whole = Box::whole(Tensor::from_floats({2, 4, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  const Box e1_gate = whole.index(1).slice(0, 0, 2);
  EXPECT_TRUE(e1_gate.contiguous());
  EXPECT_EQ(e1_gate.read().to_floats(), (std::vector<float>{8, 9, 10, 11}));
  const Box gates = whole.slice(1, 0, 2);
  EXPECT_FALSE(gates.contiguous());
  EXPECT_EQ(gates.read().to_floats(), (std::vector<float>{0, 1, 2, 3, 8, 9, 10, 11}));
  gates.write(Tensor::from_floats({2, 2, 2}, {-1, -2, -3, -4, -5, -6, -7, -8}));
  EXPECT_EQ(whole.base.to_floats(),
            (std::vector<float>{-1, -2, -3, -4, 4, 5, 6, 7, -5, -6, -7, -8, 12, 13, 14, 15}));
}

// ---------------------------------------------------------------------------------------------------------------
// GPT-OSS

FakeCheckpoint gpt_oss_bf16_checkpoint(const std::vector<HfParam>& params) {
  // Stored under the in-memory names with HF's own layouts: gate_up [E, H, 2I] (interleaved), down [E, I, H].
  FakeCheckpoint c;
  for (size_t i = 0; i < params.size(); ++i) {
    Shape s = params[i].shape;
    const std::string& n = params[i].name;
    if (n.ends_with("experts.gate_up_proj") || n.ends_with("experts.down_proj")) std::swap(s[1], s[2]);
    c.add(n, pattern_tensor(s, DType::BF16, static_cast<uint32_t>(i + 1)));
  }
  return c;
}

TEST(HfNameMapGptOss, Bf16CheckpointRoundTripsAndDeinterleaves) {
  const hf_test::GptOssDims d;
  const auto params = hf_test::gpt_oss_params(d);
  const HfNameMap map(hf_test::gpt_oss_layout(), params);
  const FakeCheckpoint c = gpt_oss_bf16_checkpoint(params);
  expect_save_reproduces(map, c);
  expect_load_reproduces(map, hf_test::pattern_params(params));
  // Element placement: HF gate_up[e, h, 2i] is gate row i, [e, h, 2i+1] up row i (gate = [..., ::2]).
  const std::vector<Tensor> v = map.load(c.view());
  auto idx = [&](const std::string& n) {
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].name == n) return i;
    return params.size();
  };
  const std::string x = "model.layers.1.mlp.experts.";
  const Tensor& hf_gu = const_cast<FakeCheckpoint&>(c).at(x + "gate_up_proj");
  const Tensor& gu = v[idx(x + "gate_up_proj")];
  for (int64_t e = 0; e < d.E; ++e)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.I; ++i) {
        const int64_t at = (e * d.H + h) * 2 * d.I;
        ASSERT_EQ(bf16_at(gu, (e * 2 * d.I + i) * d.H + h), bf16_at(hf_gu, at + 2 * i));
        ASSERT_EQ(bf16_at(gu, (e * 2 * d.I + d.I + i) * d.H + h), bf16_at(hf_gu, at + 2 * i + 1));
      }
  const Tensor& hf_b = const_cast<FakeCheckpoint&>(c).at(x + "gate_up_proj_bias");
  const Tensor& b = v[idx(x + "gate_up_proj_bias")];
  for (int64_t e = 0; e < d.E; ++e)
    for (int64_t i = 0; i < d.I; ++i) {
      EXPECT_EQ(bf16_at(b, e * 2 * d.I + i), bf16_at(hf_b, e * 2 * d.I + 2 * i));
      EXPECT_EQ(bf16_at(b, e * 2 * d.I + d.I + i), bf16_at(hf_b, e * 2 * d.I + 2 * i + 1));
    }
  const Tensor& hf_down = const_cast<FakeCheckpoint&>(c).at(x + "down_proj");  // [E, I, H]
  const Tensor& down = v[idx(x + "down_proj")];                                // [E, H, I]
  for (int64_t e = 0; e < d.E; ++e)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.I; ++i)
        ASSERT_EQ(bf16_at(down, (e * d.H + h) * d.I + i), bf16_at(hf_down, (e * d.I + i) * d.H + h));
}

// MXFP4 experts as the hub stores them: blocks [E, R, C/32, 16] and scales [E, R, C/32] where HF's dequantised
// tensor is [E, C, R] (gate_up: R = 2I interleaved rows, C = H). Each in-memory element is checked against the
// value decoded here from its byte and scale.
TEST(HfNameMapGptOss, Mxfp4ExpertsDequantiseIntoPlace) {
  const hf_test::GptOssDims d;
  const auto params = hf_test::gpt_oss_params(d);
  const HfNameMap map(hf_test::gpt_oss_layout(), params);
  FakeCheckpoint c = gpt_oss_bf16_checkpoint(params);
  const std::string x = "model.layers.0.mlp.experts.";
  auto quantise = [&](const std::string& name, int64_t R, int64_t C, uint32_t salt) {
    c.erase(name);
    Tensor bl = Tensor::empty({d.E, R, C / 32, 16}, DType::U8), sc = Tensor::empty({d.E, R, C / 32}, DType::U8);
    for (int64_t k = 0; k < bl.numel(); ++k) bl.data_as<uint8_t>()[k] = static_cast<uint8_t>((k * 37 + salt) % 256);
    for (int64_t k = 0; k < sc.numel(); ++k) sc.data_as<uint8_t>()[k] = static_cast<uint8_t>(120 + (k + salt) % 15);
    c.add(name + "_blocks", bl);
    c.add(name + "_scales", sc);
    return std::make_pair(bl, sc);
  };
  auto [gb, gs] = quantise(x + "gate_up_proj", 2 * d.I, d.H, 3);
  auto [db, ds] = quantise(x + "down_proj", d.H, d.I, 5);
  // The value HF gives at blocks-row r, column k (§8.5): byte k/2 of group k/32, low nibble for even k.
  auto value = [](const Tensor& bl, const Tensor& sc, int64_t e, int64_t r, int64_t k) {
    const int64_t G = sc.dim(2);
    const uint8_t byte = bl.data_as<uint8_t>()[((e * bl.dim(1) + r) * G + k / 32) * 16 + (k % 32) / 2];
    const uint8_t code = k % 2 == 0 ? (byte & 0xF) : (byte >> 4);
    const int mag_e = (code >> 1) & 3, m = code & 1;
    const double mag = mag_e == 0 ? m * 0.5 : (1 + m / 2.0) * std::ldexp(1.0, mag_e - 1);
    const int s = sc.data_as<uint8_t>()[(e * sc.dim(1) + r) * G + k / 32];
    return float_to_bf16(static_cast<float>(((code & 8) ? -mag : mag) * std::ldexp(1.0, s - 127)));
  };
  const std::vector<Tensor> v = map.load(c.view());
  const Tensor& gu = v[12];  // layer 0 experts.gate_up_proj [E, 2I, H]
  const Tensor& down = v[14];  // layer 0 experts.down_proj [E, H, I]
  ASSERT_EQ(map.params()[12].name, x + "gate_up_proj");
  ASSERT_EQ(map.params()[14].name, x + "down_proj");
  for (int64_t e = 0; e < d.E; ++e)
    for (int64_t i = 0; i < d.I; ++i)
      for (int64_t h = 0; h < d.H; ++h) {
        ASSERT_EQ(bf16_at(gu, (e * 2 * d.I + i) * d.H + h), value(gb, gs, e, 2 * i, h));
        ASSERT_EQ(bf16_at(gu, (e * 2 * d.I + d.I + i) * d.H + h), value(gb, gs, e, 2 * i + 1, h));
        ASSERT_EQ(bf16_at(down, (e * d.H + h) * d.I + i), value(db, ds, e, h, i));
      }
  // Saving the dequantised model writes plain bf16 tensors under the HF names; reading those back gives the same.
  const FakeCheckpoint saved = hf_test::saved_checkpoint(map, v);
  for (const auto& [n, t] : saved.tensors) EXPECT_EQ(n.find("_blocks"), std::string::npos) << n;
  const std::vector<Tensor> again = map.load(saved.view());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_TRUE(bytes_equal(again[i], v[i])) << params[i].name;
  // An expert share of an MXFP4 stack: compact rows 1..2 equal the full load's.
  HfLoadOptions o;
  o.expert_first = 1;
  o.expert_count = 2;
  o.compact_experts = true;
  const std::vector<Tensor> part = map.load(c.view(), o);
  EXPECT_TRUE(bytes_equal(part[12], v[12].rows(1, 3)));
  EXPECT_TRUE(bytes_equal(part[13], v[13].rows(1, 3)));
  EXPECT_TRUE(bytes_equal(part[14], v[14].rows(1, 3)));
  EXPECT_TRUE(bytes_equal(part[0], v[0]));
  // F32 target: the same values (exact in both).
  auto p32 = hf_test::gpt_oss_params(d, DType::F32);
  const std::vector<Tensor> v32 = HfNameMap(hf_test::gpt_oss_layout(), p32).load(c.view());
  EXPECT_TRUE(bytes_equal(v32[12].to(DType::BF16), v[12]));
}

// ---------------------------------------------------------------------------------------------------------------
// DeepSeek-V3

FakeCheckpoint dsv3_bf16_checkpoint(const HfNameMap& map) {
  return hf_test::saved_checkpoint(map, hf_test::pattern_params(map.params()));
}

TEST(HfNameMapDsv3, Bf16RoundTripsPerExpertSortedAndDropsMtp) {
  const hf_test::Dsv3Dims d;
  const auto params = hf_test::dsv3_params(d);
  const HfNameMap map(hf_test::dsv3_layout(d), params);
  expect_load_reproduces(map, hf_test::pattern_params(params));
  FakeCheckpoint c = dsv3_bf16_checkpoint(map);
  // Names and order: sorted by in-memory name, each stack expanded (gate 0..E-1, then up 0..E-1).
  std::vector<std::string> names;
  for (const auto& [n, t] : c.tensors) names.push_back(n);
  const auto at = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  const std::string x = "model.layers.1.mlp.experts.";
  EXPECT_EQ(at(x + "0.down_proj.weight") + 1, at(x + "1.down_proj.weight"));
  EXPECT_EQ(at(x + "2.down_proj.weight") + 1, at(x + "0.gate_proj.weight"));
  EXPECT_EQ(at(x + "2.gate_proj.weight") + 1, at(x + "0.up_proj.weight"));
  EXPECT_LT(at("model.layers.1.mlp.gate.e_score_correction_bias"), at("model.layers.1.mlp.gate.weight"));
  EXPECT_EQ(c.at("model.layers.1.mlp.gate.e_score_correction_bias").dtype(), DType::F32);
  EXPECT_EQ(names.front(), "lm_head.weight");
  // The MTP layer (layer 2 when num_hidden_layers = 2) is read past and not written back.
  c.add("model.layers.2.self_attn.q_a_proj.weight", pattern_tensor({d.q_lora, d.H}, DType::BF16, 9));
  c.add("model.layers.2.embed_tokens.weight", pattern_tensor({d.V, d.H}, DType::BF16, 9));
  expect_save_reproduces(map, c, {"model.layers.2.self_attn.q_a_proj.weight", "model.layers.2.embed_tokens.weight"});
}

// FP8 weights with 4x4 blocks (rows 6 and 10 leave partial edge blocks), per-expert FP8 stacked and concatenated:
// every element is bf16(f32(q) · scale[i/4, j/4]).
TEST(HfNameMapDsv3, Fp8BlocksDequantiseIntoPlace) {
  const hf_test::Dsv3Dims d;
  const auto params = hf_test::dsv3_params(d);
  const HfNameMap map(hf_test::dsv3_layout(d), params);
  FakeCheckpoint c = dsv3_bf16_checkpoint(map);
  std::vector<std::pair<std::string, Tensor>> q_of;  // name -> its fp8 bytes
  for (auto& [n, t] : c.tensors) {
    const bool linear = n.ends_with("proj.weight") || n.ends_with("proj_with_mqa.weight");
    if (!linear || n.starts_with("lm_head")) continue;
    Tensor q = Tensor::empty(t.shape(), DType::F8_E4M3);
    for (int64_t k = 0; k < q.numel(); ++k)  // every code, NaN (0x7F, 0xFF) and -0 (0x80) included
      q.data_as<uint8_t>()[k] = static_cast<uint8_t>((k * 29 + static_cast<int64_t>(n.size())) % 256);
    t = q;
    q_of.emplace_back(n, q);
  }
  for (const auto& [n, q] : q_of) {
    Tensor s = Tensor::empty(fp8_block_scale_shape(q.shape(), 4, 4), DType::F32);
    for (int64_t k = 0; k < s.numel(); ++k) s.data_as<float>()[k] = 0.01f * static_cast<float>(k + 1) + 0.3f;
    c.add(n + "_scale_inv", s);
  }
  HfLoadOptions o;
  o.fp8_block_rows = o.fp8_block_cols = 4;
  const std::vector<Tensor> v = map.load(c.view(), o);
  auto expect_deq = [&](const Tensor& got, const std::string& name) {
    Tensor q, s;
    for (auto& [n, t] : c.tensors) {
      if (n == name) q = t;
      if (n == name + "_scale_inv") s = t;
    }
    const int64_t R = q.dim(0), C = q.dim(1), SC = s.dim(1);
    ASSERT_EQ(got.numel(), R * C) << name;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) {
        const float w = fp8_e4m3_to_float(q.data_as<uint8_t>()[i * C + j]) * s.data_as<float>()[(i / 4) * SC + j / 4];
        const uint16_t want = std::isnan(w) ? 0x7FC0 : float_to_bf16(w);  // NaN canonical (io/dequant.h)
        ASSERT_EQ(bf16_at(got, i * C + j), want) << name << " " << i << "," << j;
      }
  };
  for (size_t p = 0; p < params.size(); ++p) {
    const std::string& n = params[p].name;
    if (n.ends_with("self_attn.kv_a_proj_with_mqa.weight") || n.ends_with("mlp.down_proj.weight"))
      expect_deq(v[p], n);
    if (n == "model.layers.1.mlp.experts.gate_up_proj")
      for (int64_t e = 0; e < d.E; ++e) {
        expect_deq(v[p][e].rows(0, d.I), "model.layers.1.mlp.experts." + std::to_string(e) + ".gate_proj.weight");
        expect_deq(v[p][e].rows(d.I, 2 * d.I), "model.layers.1.mlp.experts." + std::to_string(e) + ".up_proj.weight");
      }
  }
  // The dequantised model saves as plain bf16 (no scales), and loads back to the same parameters.
  const FakeCheckpoint saved = hf_test::saved_checkpoint(map, v);
  for (const auto& [n, t] : saved.tensors) {
    EXPECT_FALSE(n.ends_with("_scale_inv")) << n;
    EXPECT_NE(t.dtype(), DType::F8_E4M3) << n;
  }
  const std::vector<Tensor> again = map.load(saved.view());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_TRUE(bytes_equal(again[i], v[i])) << params[i].name;
}

// ---------------------------------------------------------------------------------------------------------------
// Nemotron-H

TEST(HfNameMapNemotronH, BackboneNamesRoundTripAndMtpIsIgnored) {
  const hf_test::NemhDims d;
  const auto params = hf_test::nemotron_h_params(d);
  const HfNameMap map(hf_test::nemotron_h_layout(), params);
  expect_load_reproduces(map, hf_test::pattern_params(params));
  FakeCheckpoint c = hf_test::saved_checkpoint(map, hf_test::pattern_params(params));
  for (const auto& [n, t] : c.tensors) EXPECT_TRUE(n.starts_with("backbone.") || n == "lm_head.weight") << n;
  EXPECT_EQ(c.at("backbone.layers.1.mixer.experts.2.up_proj.weight").shape(), (Shape{d.I, d.H}));
  EXPECT_EQ(c.at("backbone.layers.1.mixer.gate.e_score_correction_bias").dtype(), DType::F32);
  c.add("mtp.layers.0.mixer.q_proj.weight", pattern_tensor({d.q, d.H}, DType::BF16, 3));
  expect_save_reproduces(map, c, {"mtp.layers.0.mixer.q_proj.weight"});
  // A model.* name in a backbone checkpoint is not the parameter (HF renames the stored name, not ours).
  c.add("model.norm_f.weight", pattern_tensor({d.H}, DType::BF16, 3));
  io_test::expect_error([&] { map.load(c.view()); }, {"unexpected tensor 'model.norm_f.weight'"});
}

// Where each saved tensor comes from (what a shared save splits by): per-expert tensors name their expert whatever
// their names look like, a fused stack keeps its experts as rows, everything else is neither.
TEST(HfNameMapSources, EachSavedTensorNamesItsParameterAndExperts) {
  auto sources_by_name = [](const HfNameMap& map) {
    std::map<std::string, HfSavedSource> r;
    const auto names = map.saved_names();
    const auto sources = map.saved_sources();
    EXPECT_EQ(names.size(), sources.size());
    for (size_t i = 0; i < sources.size() && i < names.size(); ++i) {
      EXPECT_EQ(sources[i].name, names[i].first);
      r[sources[i].name] = sources[i];
    }
    return r;
  };
  auto param_of = [](const HfNameMap& map, const HfSavedSource& s) { return map.params().at(s.param).name; };

  const hf_test::Dsv3Dims d3;  // per-expert like Qwen3-MoE, concatenated gate|up; shared experts are not experts
  const HfNameMap dsv3(hf_test::dsv3_layout(d3), hf_test::dsv3_params(d3));
  auto s = sources_by_name(dsv3);
  EXPECT_EQ(param_of(dsv3, s.at("model.layers.1.mlp.experts.2.up_proj.weight")),
            "model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_EQ(s.at("model.layers.1.mlp.experts.2.up_proj.weight").expert, 2);
  EXPECT_EQ(s.at("model.layers.1.mlp.experts.0.down_proj.weight").expert, 0);
  EXPECT_EQ(s.at("model.layers.1.mlp.shared_experts.up_proj.weight").expert, -1);
  EXPECT_FALSE(s.at("model.layers.1.mlp.shared_experts.up_proj.weight").expert_rows);
  EXPECT_FALSE(s.at("model.layers.1.mlp.experts.2.up_proj.weight").expert_rows);

  const hf_test::GptOssDims g;  // fused, transposed, interleaved: the experts stay rows
  const HfNameMap gpt(hf_test::gpt_oss_layout(), hf_test::gpt_oss_params(g));
  s = sources_by_name(gpt);
  for (const char* n : {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.gate_up_proj_bias",
                        "model.layers.1.mlp.experts.down_proj", "model.layers.1.mlp.experts.down_proj_bias"}) {
    EXPECT_EQ(param_of(gpt, s.at(n)), n);
    EXPECT_EQ(s.at(n).expert, -1) << n;
    EXPECT_TRUE(s.at(n).expert_rows) << n;
  }
  EXPECT_FALSE(s.at("model.layers.1.mlp.router.weight").expert_rows);

  const hf_test::NemhDims n;  // renamed per-expert tensors
  const HfNameMap nemh(hf_test::nemotron_h_layout(), hf_test::nemotron_h_params(n));
  s = sources_by_name(nemh);
  EXPECT_EQ(param_of(nemh, s.at("backbone.layers.1.mixer.experts.2.down_proj.weight")),
            "model.layers.1.mixer.experts.down_proj");
  EXPECT_EQ(s.at("backbone.layers.1.mixer.experts.2.down_proj.weight").expert, 2);
  EXPECT_EQ(param_of(nemh, s.at("backbone.embeddings.weight")), "model.embeddings.weight");
  EXPECT_EQ(s.at("backbone.embeddings.weight").expert, -1);
}

TEST(HfNameMapRename, PlaceholdersBindIndices) {
  HfLayout l;
  l.rules = {hf_rename("backbone.layers.{L}.mixer.", "model.layers.{L}.mixer."), hf_rename("backbone.", "model.")};
  const std::vector<HfParam> params = {{"model.layers.0.mixer.w", {2}, DType::F32},
                                       {"model.layers.12.mixer.w", {2}, DType::F32},
                                       {"model.norm_f.weight", {2}, DType::F32},
                                       {"lm_head.weight", {2}, DType::F32}};
  const HfNameMap map(l, params);
  const auto names = map.saved_names();
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[0].first, "backbone.layers.0.mixer.w");
  EXPECT_EQ(names[1].first, "backbone.layers.12.mixer.w");
  EXPECT_EQ(names[2].first, "backbone.norm_f.weight");
  EXPECT_EQ(names[3].first, "lm_head.weight");
  expect_load_reproduces(map, hf_test::pattern_params(params));
}

}  // namespace
}  // namespace mt
