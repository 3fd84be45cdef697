// Generation with a KV cache against the model's own full forward(): the cached logits at every position
// equal the no-cache logits of the same sequence, and greedy decoding equals an independent slow loop that
// re-runs forward() over the whole sequence for each new token. When tools/hf_reference/make_generate_goldens.py
// has written tests/fixtures/qwen3_moe/<variant>/generate.json, greedy output must equal Transformers' generate().
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/rng.h"
#include "models/causal_lm.h"
#include "models/generation_config.h"
#include "models/generate.h"
#include "models/decoder_model.h"
#include "hf_fixture_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/qwen3_moe";
const char* kVariants[] = {"moe_gqa_aux", "moe_mha_tied_sparse2", "moe_mqa_legacy", "dense_qwen3"};

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int64_t>(rng.next_u64() % vocab));
  return ids;
}

// F32 [S, V] logits of forward() over the whole sequence, no cache.
std::vector<float> full_logits(const CausalLM& m, const std::vector<int64_t>& ids) {
  Batch b;
  b.input_ids = Tensor::empty({1, static_cast<int64_t>(ids.size())}, DType::I64);
  std::copy(ids.begin(), ids.end(), b.input_ids.data_as<int64_t>());
  ModelWeights w = m.weights;  // shares the tensors; DecoderModel wants a mutable reference
  return DecoderModel(m.config, w).forward(b, true).logits.to_floats();
}

// Prefill `first` tokens, then the next `chunk` together (a prefill at offset > 0), then one per step.
std::vector<float> cached_logits(CausalLM& m, const std::vector<int64_t>& ids, size_t first, size_t chunk) {
  Generator gen(m.config, m.weights, static_cast<int64_t>(ids.size()));
  std::vector<float> out;
  auto append = [&](const Tensor& t) {
    auto v = t.to_floats();
    out.insert(out.end(), v.begin(), v.end());
  };
  append(gen.extend({ids.begin(), ids.begin() + first}, true));
  append(gen.extend({ids.begin() + first, ids.begin() + first + chunk}, true));
  for (size_t i = first + chunk; i < ids.size(); ++i) append(gen.decode_step(ids[i]));
  EXPECT_EQ(gen.length(), static_cast<int64_t>(ids.size()));
  return out;
}

using test::rel_norm_error;

// Largest |a − b| / max(1, |b|) over all elements.
double max_rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - ref[i]) / std::max(1.0, std::fabs(double(ref[i]))));
  return m;
}

// The slow reference: for each new token, forward() over prompt + everything generated so far, argmax of the
// last row (the lowest index among equal maxima).
std::vector<int64_t> greedy_by_full_forward(const CausalLM& m, std::vector<int64_t> seq, int64_t steps) {
  std::vector<int64_t> out;
  const int64_t V = m.config.vocab_size;
  for (int64_t s = 0; s < steps; ++s) {
    auto logits = full_logits(m, seq);
    const float* last = logits.data() + (seq.size() - 1) * V;
    const int64_t id = std::max_element(last, last + V) - last;
    out.push_back(id);
    seq.push_back(id);
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class Generate : public ::testing::TestWithParam<const char*> {};

TEST_P(Generate, CachedLogitsEqualFullForwardFp32) {
  CausalLM m = CausalLM::from_pretrained((kFixtures / GetParam() / "ckpt").string(), {DType::F32});
  const auto ids = random_ids(16, m.config.vocab_size, 11);
  const auto ref = full_logits(m, ids);
  const auto got = cached_logits(m, ids, 5, 4);
  ASSERT_EQ(got.size(), ref.size());
  // Not bitwise: the cache multiplies matrices of 5, 4 and 1 rows where the full forward multiplies 16, and the CPU
  // BLAS may take other kernels for them. Each fp32 dot product (K ≤ 48) then moves by up to K·u·Σ|a·b| ≈ 2.9e-6·Σ|a·b|,
  // compounded over ≤ 4 layers. Measured over OpenBLAS's x86-64 core types: max rel ≤ 6.9e-6 (Prescott; Haswell
  // 5.4e-6), norm ≤ 6.8e-7. We allow 3e-5 and 2e-6.
  EXPECT_LE(max_rel_error(got, ref), 3e-5);
  EXPECT_LE(rel_norm_error(got, ref), 2e-6);
}

TEST_P(Generate, CachedLogitsEqualFullForwardBf16) {
  CausalLM m = CausalLM::from_pretrained((kFixtures / GetParam() / "ckpt").string(), {DType::BF16});
  const auto ids = random_ids(16, m.config.vocab_size, 12);
  const auto ref = full_logits(m, ids);
  const auto got = cached_logits(m, ids, 5, 4);
  ASSERT_EQ(got.size(), ref.size());
  // Same bf16 rounding points; an fp32 sum that associates differently in a GEMM can flip one rounding,
  // which then moves later values by about one bf16 ulp (2^-8 relative).
  // Measured over OpenBLAS's x86-64 core types: ≤ 4.4e-3, ≥ 79% of the logits bit-identical (all of them on some).
  EXPECT_LE(rel_norm_error(got, ref), 1e-2);
  size_t equal = 0;
  for (size_t i = 0; i < got.size(); ++i) equal += got[i] == ref[i];
  EXPECT_GE(equal, got.size() / 2) << "most bf16 logits should be bit-identical";
}

TEST_P(Generate, GreedyEqualsArgmaxOfFullForwardEachStep) {
  CausalLM m = CausalLM::from_pretrained((kFixtures / GetParam() / "ckpt").string(), {DType::F32});
  const auto prompt = random_ids(6, m.config.vocab_size, 13);
  const auto ref = greedy_by_full_forward(m, prompt, 10);
  GenerateOptions o;
  o.max_new_tokens = 10;
  o.sampling.temperature = 0;
  std::vector<int64_t> streamed;
  GenerateResult r = generate(m.config, m.weights, prompt, o, [&](int64_t id) { streamed.push_back(id); });
  EXPECT_EQ(r.ids, ref);
  EXPECT_EQ(streamed, ref);
  EXPECT_EQ(r.stop_reason, "max_new_tokens");

  // Stopping at an EOS id: generation ends right after its first occurrence, which is kept.
  o.eos_token_ids = {999999, ref[4]};
  r = generate(m.config, m.weights, prompt, o);
  const auto first = std::find(ref.begin(), ref.end(), ref[4]);
  EXPECT_EQ(r.ids, std::vector<int64_t>(ref.begin(), first + 1));
  EXPECT_EQ(r.stop_reason, "eos");
}

INSTANTIATE_TEST_SUITE_P(Variants, Generate, ::testing::ValuesIn(kVariants));

TEST(GenerateLimits, MaxPositionEmbeddingsAndBadInputs) {
  CausalLM m = CausalLM::from_pretrained((kFixtures / "dense_qwen3/ckpt").string(), {DType::F32});
  const auto prompt = random_ids(6, m.config.vocab_size, 14);
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 5;
  const auto ref = generate(m.config, m.weights, prompt, o).ids;
  ASSERT_EQ(ref.size(), 5u);

  DecoderSpec short_cfg = m.config;
  short_cfg.max_position_embeddings = 9;  // room for 3 new tokens
  GenerateResult r = generate(short_cfg, m.weights, prompt, o);
  EXPECT_EQ(r.ids, std::vector<int64_t>(ref.begin(), ref.begin() + 3));
  EXPECT_EQ(r.stop_reason, "max_length");
  short_cfg.max_position_embeddings = 6;
  r = generate(short_cfg, m.weights, prompt, o);
  EXPECT_TRUE(r.ids.empty());
  EXPECT_EQ(r.stop_reason, "max_length");
  short_cfg.max_position_embeddings = 5;
  EXPECT_EQ(error_of([&] { generate(short_cfg, m.weights, prompt, o); }),
            "generate: the prompt has 6 tokens, more than max_position_embeddings = 5");

  o.max_new_tokens = 0;
  r = generate(m.config, m.weights, prompt, o);
  EXPECT_TRUE(r.ids.empty());
  EXPECT_EQ(r.stop_reason, "max_new_tokens");
  o.max_new_tokens = -1;
  EXPECT_EQ(error_of([&] { generate(m.config, m.weights, prompt, o); }), "--max-new-tokens must be >= 0, found -1");
  o.max_new_tokens = 3;
  EXPECT_EQ(error_of([&] { generate(m.config, m.weights, {}, o); }),
            "generate: the prompt is empty (it must hold at least one token)");
  EXPECT_EQ(error_of([&] { generate(m.config, m.weights, {3, 128, 4}, o); }),
            "generate: token id 128 at position 1 is outside the model vocabulary [0, 128)");
  o.sampling.top_p = 0;
  EXPECT_EQ(error_of([&] { generate(m.config, m.weights, prompt, o); }), "--top-p must be in (0, 1], found 0");

  Generator gen(m.config, m.weights, 4);
  gen.prefill({1, 2, 3});
  gen.decode_step(4);
  EXPECT_EQ(error_of([&] { gen.decode_step(5); }),
            "decode cache: 4 positions held and 1 more do not fit its capacity of 4");
  // prefill empties the cache first.
  EXPECT_EQ(gen.prefill({1, 2}).numel(), m.config.vocab_size);
  EXPECT_EQ(gen.length(), 2);
}

TEST(GenerateSampling, SameSeedSameTokensAndSeedMatters) {
  CausalLM m = CausalLM::from_pretrained((kFixtures / "moe_gqa_aux/ckpt").string(), {DType::F32});
  const auto prompt = random_ids(4, m.config.vocab_size, 15);
  test::expect_sampling_seeded_and_top_k1_greedy(m, prompt);
}

// Transformers' greedy generate() (use_cache=True, fp32) on the same checkpoints, when the goldens exist.
TEST_P(Generate, GreedyEqualsTransformersGoldens) {
  const fs::path dir = kFixtures / GetParam();
  if (!fs::exists(dir / "generate.json"))
    GTEST_SKIP() << (dir / "generate.json").string() << " not made yet (tools/hf_reference/make_generate_goldens.py)";
  test::expect_greedy_equals_goldens(dir);
}

}  // namespace
}  // namespace mt
