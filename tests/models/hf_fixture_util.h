// Reading the Transformers fixtures (tests/fixtures/qwen3_moe, tools/hf_reference/make_model_fixtures.py):
// meta.json, the batches' safetensors, the one-step AdamW settings. Shared by the CPU and CUDA parity tests.
#pragma once
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "models/generate.h"
#include "models/generation_config.h"
#include "train/adamw.h"

namespace mt::test {

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// input_ids, labels and (packed batches) position_ids of a fixture batch file.
inline Batch load_batch(const SafetensorsFile& f) {
  Batch b;
  b.input_ids = f.tensor("input_ids").clone();
  b.labels = f.tensor("labels").clone();
  if (f.has("position_ids")) b.position_ids = f.tensor("position_ids").clone();
  return b;
}

// meta.json "adamw_one_step": {lr, betas, eps, weight_decay} as AdamW options.
inline AdamWOptions adamw_options(const nlohmann::json& hp) {
  AdamWOptions o;
  o.lr = hp["lr"];
  o.beta1 = hp["betas"][0];
  o.beta2 = hp["betas"][1];
  o.eps = hp["eps"];
  o.weight_decay = hp["weight_decay"];
  return o;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// |a − ref|₂ / |ref|₂
inline double rel_norm_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// n ids drawn uniformly from [0, vocab) with Rng(seed).
inline std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int64_t>(rng.next_u64() % vocab));
  return ids;
}

// F32 [S, V] logits of DecoderModel::forward() over the whole sequence, no cache: what the cached generation of a
// family is held to.
inline std::vector<float> full_forward_logits(const CausalLM& m, const std::vector<int64_t>& ids) {
  Batch b;
  b.input_ids = Tensor::empty({1, static_cast<int64_t>(ids.size())}, DType::I64);
  std::copy(ids.begin(), ids.end(), b.input_ids.data_as<int64_t>());
  ModelWeights w = m.weights;  // shares the tensors; DecoderModel wants a mutable reference
  return DecoderModel(m.config, w).forward(b, true).logits.to_floats();
}

// Greedy generate() (its decode cache) against the slow reference: for each new token, forward() over everything so
// far and the argmax of the last row; 10 new tokens after `prompt`.
inline void expect_greedy_equals_full_forward_argmax(CausalLM& m, const std::vector<int64_t>& prompt) {
  std::vector<int64_t> seq = prompt, ref;
  const int64_t V = m.config.vocab_size;
  for (int s = 0; s < 10; ++s) {
    const auto logits = full_forward_logits(m, seq);
    const float* last = logits.data() + (seq.size() - 1) * V;
    ref.push_back(std::max_element(last, last + V) - last);
    seq.push_back(ref.back());
  }
  GenerateOptions o;
  o.max_new_tokens = 10;
  o.sampling.temperature = 0;
  const GenerateResult r = generate(m.config, m.weights, prompt, o);
  EXPECT_EQ(r.ids, ref);
  EXPECT_EQ(r.stop_reason, "max_new_tokens");
}

// Sampling at temperature 1.5: the same seed gives the same 12 tokens, another seed others, and top-k 1 is greedy.
inline void expect_sampling_seeded_and_top_k1_greedy(CausalLM& m, const std::vector<int64_t>& prompt) {
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.sampling.temperature = 1.5;
  o.seed = 5;
  const auto a = generate(m.config, m.weights, prompt, o).ids;
  EXPECT_EQ(a.size(), 12u);
  EXPECT_EQ(generate(m.config, m.weights, prompt, o).ids, a);
  o.seed = 6;
  EXPECT_NE(generate(m.config, m.weights, prompt, o).ids, a);
  o.sampling.top_k = 1;
  const auto k1 = generate(m.config, m.weights, prompt, o).ids;
  o.sampling = {};
  o.sampling.temperature = 0;
  EXPECT_EQ(generate(m.config, m.weights, prompt, o).ids, k1);
}

// Transformers' greedy generate() goldens (<dir>/generate.json: prompts, outputs, max_new_tokens) against ours on
// <dir>/ckpt in fp32.
inline void expect_greedy_equals_goldens(const std::filesystem::path& dir) {
  const nlohmann::json g = read_json(dir / "generate.json");
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::F32});
  const GenerationConfig gc = generation_config_read((dir / "ckpt").string(), m.config.raw);
  ASSERT_EQ(g["prompts"].size(), g["outputs"].size());
  ASSERT_FALSE(g["prompts"].empty());
  for (size_t i = 0; i < g["prompts"].size(); ++i) {
    SCOPED_TRACE(i);
    GenerateOptions o;
    o.max_new_tokens = g.value("max_new_tokens", 12);
    o.sampling.temperature = 0;
    o.eos_token_ids = gc.eos_token_ids;
    const auto r = generate(m.config, m.weights, g["prompts"][i].get<std::vector<int64_t>>(), o);
    EXPECT_EQ(r.ids, g["outputs"][i].get<std::vector<int64_t>>());
  }
}

// Load + save of a Transformers-saved checkpoint rewrites its shards and index byte for byte (the source's shard
// map), and greedy sharding at the generator's 40,000 bytes reproduces save_pretrained's mapping on its own.
inline void expect_convert_reproduces(const std::filesystem::path& src, const std::string& tag) {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / ("mt_convert_" + tag);
  fs::remove_all(out);
  CausalLM::from_pretrained(src.string()).save_pretrained(out.string());
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model", 0) != 0) continue;
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(out / name));
    EXPECT_TRUE(read_bytes(e.path()) == read_bytes(out / name));
  }
  EXPECT_EQ(read_bytes(src / "generation_config.json"), read_bytes(out / "generation_config.json"));
  const fs::path out2 = out.string() + "_greedy";
  fs::remove_all(out2);
  SaveOptions so;
  so.max_shard_bytes = 40000;
  CausalLM::from_pretrained(src.string()).save_pretrained(out2.string(), so);
  EXPECT_EQ(read_json(src / "model.safetensors.index.json")["weight_map"],
            read_json(out2 / "model.safetensors.index.json")["weight_map"]);
  fs::remove_all(out);
  fs::remove_all(out2);
}

}  // namespace mt::test
