// Fine-grained FP8 checkpoints (hf-numerics.md §8.6; Qwen3-30B-A3B-FP8's layout): a tiny Qwen3-MoE fixture is
// quantised here to e4m3 with per-block scales by an encoder independent of the engine, then loaded (every weight
// must be the exact dequantised value), converted (float tensors, no quantization_config) and broken on purpose
// (one-line errors naming the file and the tensor or field).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

#include "core/error.h"
#include "io/checkpoint_files.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "hf_fixture_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, Tensor>>;
const fs::path kFixture = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/qwen3_moe/moe_gqa_aux";
// Smaller than the fixture's dims (32, 48, 64, 16, 128) and not dividing most of them, so rows and columns both
// end in partial blocks (16 columns in one 20-wide block, 32 rows in 12 + 12 + 8); non-square, so a swap of rows
// and columns shows.
constexpr int64_t kBr = 12, kBc = 20;

// e4m3fn (bias 7, no infinities, 0x7F/0xFF NaN), decoded from its bit fields.
double e4m3_decode(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (c & 0x80) ? -mag : mag;
}

// Round to nearest e4m3, ties to the even code (the even mantissa), by search over the 127 finite magnitudes;
// |x| <= 448 here (x = w / (amax / 448)).
uint8_t e4m3_encode(double x) {
  uint8_t best = 0;
  double dbest = INFINITY;
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(std::fabs(x) - e4m3_decode(static_cast<uint8_t>(c)));
    if (d < dbest || (d == dbest && (c & 1) == 0)) {
      dbest = d;
      best = static_cast<uint8_t>(c);
    }
  }
  return std::signbit(x) ? static_cast<uint8_t>(best | 0x80) : best;
}

uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

bool quantised_here(const std::string& n) { return n.find("_proj.weight") != std::string::npos; }

struct Quantised {
  Tensor q, scale;     // F8_E4M3 [R, C], F32 [ceil(R/br), ceil(C/bc)]
  std::vector<float> deq;  // f32(decode(q)) · scale, one f32 multiply
};

Quantised quantise(const Tensor& w, int64_t br, int64_t bc) {
  const int64_t R = w.dim(0), C = w.dim(1), SR = (R + br - 1) / br, SC = (C + bc - 1) / bc;
  const std::vector<float> v = w.to_floats();
  Quantised r{Tensor::empty({R, C}, DType::F8_E4M3), Tensor::empty({SR, SC}, DType::F32),
              std::vector<float>(v.size())};
  auto* q = static_cast<uint8_t*>(r.q.data());
  float* s = r.scale.data_as<float>();
  for (int64_t bi = 0; bi < SR; ++bi)
    for (int64_t bj = 0; bj < SC; ++bj) {
      float amax = 0;
      for (int64_t i = bi * br; i < std::min(R, (bi + 1) * br); ++i)
        for (int64_t j = bj * bc; j < std::min(C, (bj + 1) * bc); ++j) amax = std::max(amax, std::fabs(v[i * C + j]));
      const float sc = amax > 0 ? amax / 448.0f : 1.0f;
      s[bi * SC + bj] = sc;
      for (int64_t i = bi * br; i < std::min(R, (bi + 1) * br); ++i)
        for (int64_t j = bj * bc; j < std::min(C, (bj + 1) * bc); ++j) {
          q[i * C + j] = e4m3_encode(static_cast<double>(v[i * C + j]) / sc);
          r.deq[i * C + j] = static_cast<float>(e4m3_decode(q[i * C + j])) * sc;
        }
    }
  return r;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected mt::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

class Fp8Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("mt_fp8_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    plain = CausalLM::from_pretrained((kFixture / "ckpt").string(), {DType::F32});
    config = test::read_json(kFixture / "ckpt/config.json");
    config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                     {"fmt", "e4m3"},
                                     {"quant_method", "fp8"},
                                     {"weight_block_size", {kBr, kBc}}};
    for (auto& [name, t] : plain.weights.to_hf(plain.config)) {
      if (!quantised_here(name)) {
        stored.emplace_back(name, t.clone());
        expected[name] = t.to_floats();
        continue;
      }
      Quantised qz = quantise(t, kBr, kBc);
      stored.emplace_back(name, qz.q);
      stored.emplace_back(name + "_scale_inv", qz.scale);
      expected[name] = qz.deq;
      ++quantised;
    }
  }
  void TearDown() override { fs::remove_all(dir); }

  // A checkpoint directory holding `tensors` and `cfg`.
  fs::path write(const std::string& name, const Named& tensors, const nlohmann::json& cfg) const {
    const fs::path d = dir / name;
    fs::create_directories(d);
    safetensors_write((d / "model.safetensors").string(), tensors);
    write_text(d / "config.json", cfg.dump(2));
    return d;
  }
  Named without(const std::string& name) const {
    Named r;
    for (const auto& kv : stored)
      if (kv.first != name) r.push_back(kv);
    return r;
  }
  Named replaced(const std::string& name, const Tensor& t) const {
    Named r = stored;
    for (auto& kv : r)
      if (kv.first == name) kv.second = t;
    return r;
  }

  fs::path dir;
  CausalLM plain;
  nlohmann::json config;
  Named stored;
  std::map<std::string, std::vector<float>> expected;
  int quantised = 0;
};

TEST_F(Fp8Checkpoint, LoadDequantisesEveryWeightExactly) {
  // 3 layers: attention q/k/v/o, layers 0 and 2 MoE (8 experts x gate/up/down), layer 1 dense gate/up/down.
  ASSERT_EQ(quantised, 3 * 4 + 2 * 8 * 3 + 3);
  const fs::path d = write("fp8", stored, config);
  CausalLM m = CausalLM::from_pretrained(d.string());
  EXPECT_EQ(m.dtype, DType::F32);  // from the float tensors; F8 weights and F32 scales are not the model dtype
  int checked = 0, partial_rows = 0, partial_cols = 0;
  for (const auto& [name, t] : m.weights.to_hf(m.config)) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.count(name));
    const std::vector<float> got = t.to_floats(), want = expected.at(name);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    ++checked;
    if (quantised_here(name)) {
      partial_rows += t.dim(0) % kBr != 0;
      partial_cols += t.dim(1) % kBc != 0;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(expected.size()));
  EXPECT_GT(partial_rows, 0);
  EXPECT_GT(partial_cols, 0);

  // bf16: one rounding of the f32 product.
  CausalLM m16 = CausalLM::from_pretrained(d.string(), {DType::BF16});
  for (const auto& [name, t] : m16.weights.to_hf(m16.config)) {
    const auto* bits = t.data_as<uint16_t>();
    const std::vector<float>& want = expected.at(name);
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += bits[i] != bf16_rne(want[i]);
    EXPECT_EQ(bad, 0) << name;
  }

  // Logits against the unquantised model. Round-to-nearest e4m3 moves each weight by at most half a step: 2^-4
  // relative (3 mantissa bits) for |w| >= 2^-6·scale, more below (subnormals); a projection's output then moves by
  // at most ~2^-4 relative, and the independent errors of the projections on a token's path (per layer q, k, v, o,
  // router, gate, up, down; 2 layers; the head: about 16) add in quadrature: sqrt(16) · 2^-4 = 0.25 bounds the
  // logits' relative L2 error. Measured: 0.110 for this fixture and batch (a first bound of 2^-4, one projection's
  // worst case, ignored the accumulation over the path and failed).
  SafetensorsFile io = SafetensorsFile::open((kFixture / "plain.safetensors").string());
  const Batch b = test::load_batch(io);
  const std::vector<float> ref = DecoderModel(plain.config, plain.weights).forward(b, true).logits.to_floats();
  const std::vector<float> got = DecoderModel(m.config, m.weights).forward(b, true).logits.to_floats();
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  const double rel = std::sqrt(num / den);
  EXPECT_GT(rel, 0.0);  // the weights did change
  EXPECT_LT(rel, 0.25);
}

TEST_F(Fp8Checkpoint, QwenBlockSize128IsOnePartialBlockPerMatrix) {
  nlohmann::json cfg = config;
  cfg["quantization_config"]["weight_block_size"] = {128, 128};
  Named t;
  for (const auto& [name, w] : plain.weights.to_hf(plain.config)) {
    if (!quantised_here(name)) {
      t.emplace_back(name, w.clone());
      continue;
    }
    Quantised qz = quantise(w, 128, 128);
    EXPECT_EQ(qz.scale.shape(), (Shape{1, 1}));
    t.emplace_back(name, qz.q);
    t.emplace_back(name + "_scale_inv", qz.scale);
    expected[name] = qz.deq;
  }
  CausalLM m = CausalLM::from_pretrained(write("fp8_128", t, cfg).string());
  for (const auto& [name, w] : m.weights.to_hf(m.config)) EXPECT_EQ(w.to_floats(), expected.at(name)) << name;
}

TEST_F(Fp8Checkpoint, ConvertWritesTheDequantisedModelWithoutQuantizationConfig) {
  const fs::path d = write("fp8", stored, config);
  const fs::path out = dir / "converted";
  const std::string cmd = std::string(MIXTUNE_BINARY) + " convert --in " + d.string() + " --out " + out.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json cfg = test::read_json(out / "config.json");
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_EQ(cfg["dtype"], "float32");
  CheckpointFiles files = CheckpointFiles::open(out.string());
  EXPECT_EQ(files.names().size(), expected.size());  // no scale_inv left
  for (const auto& n : files.names()) {
    SCOPED_TRACE(n);
    ASSERT_TRUE(expected.count(n));
    EXPECT_EQ(files.info(n).dtype, DType::F32);
    EXPECT_EQ(files.tensor(n).to_floats(), expected.at(n));
  }
  CausalLM back = CausalLM::from_pretrained(out.string());
  CausalLM fp8 = CausalLM::from_pretrained(d.string());
  const Named a = back.weights.to_hf(back.config), b = fp8.weights.to_hf(fp8.config);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.to_floats(), b[i].second.to_floats()) << a[i].first;
  }
}

TEST_F(Fp8Checkpoint, HostileTensorsAreOneLineErrorsNamingFileAndTensor) {
  const std::string q = "model.layers.0.self_attn.q_proj.weight", s = q + "_scale_inv";
  const std::string file = "model.safetensors";
  auto load = [&](const fs::path& d) { return [d] { CausalLM::from_pretrained(d.string()); }; };
  expect_error(load(write("no_scale", without(s), config)), {file, s, "missing", "F8_E4M3"});
  expect_error(load(write("scale_shape", replaced(s, Tensor::from_floats({1, 2}, {1, 1})), config)),
               {file, s, "wrong shape", "[6, 2]", "[1, 2]"});  // q_proj [64, 32]: ceil(64/12) x ceil(32/20)
  Tensor s16 = Tensor::empty({6, 2}, DType::BF16);
  expect_error(load(write("scale_dtype", replaced(s, s16), config)), {file, s, "wrong dtype", "F32", "BF16"});
  expect_error(load(write("scale_only", without(q), config)), {file, s, "has no weight", q});
  Named stray = stored;
  stray.emplace_back("model.norm.weight_scale_inv", Tensor::from_floats({1}, {1}));
  expect_error(load(write("stray", stray, config)), {file, "model.norm.weight_scale_inv", "unexpected"});
  // F8 weights need the config to say so.
  nlohmann::json cfg = config;
  cfg.erase("quantization_config");
  expect_error(load(write("undeclared", stored, cfg)), {file, "F8_E4M3", "quantization_config"});
}

TEST_F(Fp8Checkpoint, ScaleBesideAFloatWeightIsRefused) {
  Named t = stored;
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  for (auto& [n, v] : t)
    if (n == name) v = Tensor::from_floats(v.shape(), expected.at(name));
  expect_error([&] { CausalLM::from_pretrained(write("mixed", t, config).string()); },
               {"model.safetensors", name + "_scale_inv", "not F8_E4M3"});
}

TEST_F(Fp8Checkpoint, HostileQuantizationConfigNamesConfigJsonAndField) {
  auto with = [&](const std::string& tag, const nlohmann::json& qc) {
    nlohmann::json cfg = config;
    cfg["quantization_config"] = qc;
    const fs::path d = write(tag, stored, cfg);
    return [d] { CausalLM::from_pretrained(d.string()); };
  };
  nlohmann::json qc = config["quantization_config"];
  for (const char* method : {"bitsandbytes", "gptq", "awq"}) {
    qc["quant_method"] = method;
    expect_error(with(std::string("m_") + method, qc),
                 {"config.json", "quantization_config.quant_method", "unsupported quantisation", method});
  }
  qc["quant_method"] = "mxfp4";  // a form GPT-OSS stores, never Qwen3
  expect_error(with("m_mxfp4", qc),
               {"config.json", "quantization_config.quant_method", "no tensors stored as MXFP4", "mxfp4"});
  qc = config["quantization_config"];
  qc.erase("quant_method");
  expect_error(with("m_none", qc), {"config.json", "quantization_config.quant_method", "missing"});
  expect_error(with("not_obj", "fp8"), {"config.json", "field 'quantization_config'", "wrong type"});
  const std::vector<std::pair<nlohmann::json, std::string>> bad_blocks = {
      {{128}, "weight_block_size'"},   {{128, 128, 1}, "weight_block_size'"}, {"128", "weight_block_size'"},
      {{0, 128}, "weight_block_size[0]"}, {{128, -1}, "weight_block_size[1]"}, {{128, 1.5}, "weight_block_size[1]"},
      {nullptr, "weight_block_size'"}};
  int k = 0;
  for (const auto& [bs, field] : bad_blocks) {
    qc = config["quantization_config"];
    qc["weight_block_size"] = bs;
    expect_error(with("bs" + std::to_string(k++), qc), {"config.json", "quantization_config." + field});
  }
  qc = config["quantization_config"];
  qc["fmt"] = "e5m2";
  expect_error(with("fmt", qc), {"config.json", "quantization_config.fmt", "e5m2"});
  qc = config["quantization_config"];
  qc["activation_scheme"] = "static";
  expect_error(with("act", qc), {"config.json", "quantization_config.activation_scheme", "static"});
  // A block size the stored scales do not fit: the scale shapes are wrong for [16, 16].
  qc = config["quantization_config"];
  qc["weight_block_size"] = {16, 16};
  expect_error(with("bs_mismatch", qc), {"model.safetensors", "_scale_inv", "wrong shape", "16x16"});
}

}  // namespace
}  // namespace mt
