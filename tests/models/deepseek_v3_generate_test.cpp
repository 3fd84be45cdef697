// Generation for DeepSeek-V3 with the MLA decode cache (layers/mla_attention_block_cached.h) on the tiny checkpoints
// of tests/fixtures/deepseek_v3 (mla_yarn_dense1: q LoRA, YaRN with mscale_all_dim 1; plain_q_legacy_config: a plain
// q_proj, the hub's legacy rope_scaling with mscale_all_dim 0.8): the cached logits at every position equal the full
// forward's, the cache holds kv_lora_rank + qk_rope_head_dim values a position a layer and nothing per head, greedy
// decoding equals an argmax of the full forward at each step and Transformers' generate() (generate.json, made by
// tools/hf_reference/make_family_fixtures.py --family deepseek_v3), and seeded sampling is reproducible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "models/generate.h"
#include "hf_fixture_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using test::full_forward_logits;
using test::random_ids;
using test::rel_norm_error;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/deepseek_v3";
const char* kVariants[] = {"mla_yarn_dense1", "plain_q_legacy_config"};

CausalLM load(const char* variant, DType dtype) {
  return CausalLM::from_pretrained((kFixtures / variant / "ckpt").string(), {dtype});
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

// Largest |a − b| / max(1, |b|) over all elements.
double max_rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - ref[i]) / std::max(1.0, std::fabs(double(ref[i]))));
  return m;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

class DeepseekV3Generate : public ::testing::TestWithParam<const char*> {};

TEST_P(DeepseekV3Generate, CachedLogitsEqualFullForwardFp32) {
  CausalLM m = load(GetParam(), DType::F32);
  const auto ids = random_ids(40, m.config.vocab_size, 31);
  const auto ref = full_forward_logits(m, ids);
  const auto got = cached_logits(m, ids, 5, 4);
  ASSERT_EQ(got.size(), ref.size());
  const double diff = test::max_abs_diff(got, ref);
  std::printf("%s: cached vs full forward logits: max abs %.3g (logits up to %.3g), max rel %.3g, rel L2 %.3g\n",
              GetParam(), diff, max_abs(ref), max_rel_error(got, ref), rel_norm_error(got, ref));
  // The cached block runs the full forward's ops on the same numbers; what differs is the row count of each GEMM
  // (5, 4, 1 rows and a kv_b_proj over 1..40 cached positions against 40 rows), for which OpenBLAS may take other
  // kernels that sum in another order. Measured over 8 OpenBLAS core types (OPENBLAS_CORETYPE), logits up to 7.3:
  // exactly 0 on Sandybridge, max abs ≤ 1.5e-5 (Prescott; Haswell / SkylakeX ≤ 9.5e-6), rel L2 ≤ 9e-7.
  // We allow 5e-5 and 3e-6.
  EXPECT_LE(diff, 5e-5);
  EXPECT_LE(rel_norm_error(got, ref), 3e-6);
}

TEST_P(DeepseekV3Generate, CachedLogitsEqualFullForwardBf16) {
  CausalLM m = load(GetParam(), DType::BF16);
  const auto ids = random_ids(24, m.config.vocab_size, 32);
  const auto ref = full_forward_logits(m, ids);
  const auto got = cached_logits(m, ids, 5, 4);
  ASSERT_EQ(got.size(), ref.size());
  size_t equal = 0;
  for (size_t i = 0; i < got.size(); ++i) equal += got[i] == ref[i];
  std::printf("%s bf16: cached vs full rel L2 %.3g, %zu of %zu logits bit-identical\n", GetParam(),
              rel_norm_error(got, ref), equal, got.size());
  // Same bf16 rounding points; an fp32 sum that associates differently in a GEMM could flip one rounding, which then
  // moves later values by about one bf16 ulp (2^-8 relative). Measured: every logit bit-identical on 8 OpenBLAS
  // core types. We allow one ulp in L2 and 10% of the logits off.
  EXPECT_LE(rel_norm_error(got, ref), 4e-3);
  EXPECT_GE(equal, got.size() * 9 / 10) << "nearly all bf16 logits should be bit-identical";
}

// (kv_lora_rank + qk_rope_head_dim) fp32 values a position a layer: 16 + 8 on these checkpoints; no per-head keys
// and values (4 heads × (32 + 16) would be 192).
TEST_P(DeepseekV3Generate, CacheHoldsTheLatentAndTheRopeKeyOnly) {
  CausalLM m = load(GetParam(), DType::F32);
  const AttentionSpec& a = m.config.only_attention();
  ASSERT_EQ(a.kind, AttentionKind::mla);
  ASSERT_EQ(a.kv_lora_rank, 16);
  ASSERT_EQ(a.qk_rope_head_dim, 8);
  const int64_t capacity = 10, layers = m.config.num_layers();
  Generator gen(m.config, m.weights, capacity);
  const DecodeCache& c = gen.cache();
  ASSERT_EQ(c.entries.size(), static_cast<size_t>(layers));
  for (const DecodeCacheEntry& e : c.entries) {
    EXPECT_EQ(e.kind, SublayerKind::attention);
    EXPECT_EQ(e.mla.latent.shape(), Shape({capacity, a.kv_lora_rank}));
    EXPECT_EQ(e.mla.k_rot.shape(), Shape({capacity, a.qk_rope_head_dim}));
    EXPECT_FALSE(e.attention.k.defined());
    EXPECT_FALSE(e.attention.v.defined());
  }
  EXPECT_EQ(c.bytes(), capacity * layers * (a.kv_lora_rank + a.qk_rope_head_dim) * int64_t(sizeof(float)));

  // What a step writes is the latent and the rope key of that position, and nothing past it.
  gen.prefill({5, 17, 99});
  for (const DecodeCacheEntry& e : gen.cache().entries) {
    const auto lat = e.mla.latent.to_floats();
    const auto rot = e.mla.k_rot.to_floats();
    EXPECT_GT(max_abs({lat.begin(), lat.begin() + 3 * a.kv_lora_rank}), 0);
    EXPECT_GT(max_abs({rot.begin(), rot.begin() + 3 * a.qk_rope_head_dim}), 0);
    EXPECT_EQ(max_abs({lat.begin() + 3 * a.kv_lora_rank, lat.end()}), 0);
  }
}

// The slow reference: for each new token, forward() over everything so far, argmax of the last row.
TEST_P(DeepseekV3Generate, GreedyEqualsArgmaxOfFullForwardEachStep) {
  CausalLM m = load(GetParam(), DType::F32);
  test::expect_greedy_equals_full_forward_argmax(m, random_ids(7, m.config.vocab_size, 33));
}

// Transformers' greedy generate() (fp32, use_cache=True; its DynamicCache holds full per-head keys and values, whose
// numbers are the full forward's), prompts of 6, 11 and 37 tokens, 12 new tokens each.
TEST_P(DeepseekV3Generate, GreedyEqualsTransformersGoldens) {
  const fs::path dir = kFixtures / GetParam();
  if (!fs::exists(dir / "generate.json"))
    GTEST_SKIP() << (dir / "generate.json").string()
                 << " is absent: make it with tools/hf_reference/make_family_fixtures.py --family deepseek_v3";
  test::expect_greedy_equals_goldens(dir);
}

TEST_P(DeepseekV3Generate, SamplingIsSeededAndTopK1IsGreedy) {
  CausalLM m = load(GetParam(), DType::F32);
  test::expect_sampling_seeded_and_top_k1_greedy(m, random_ids(4, m.config.vocab_size, 34));
}

INSTANTIATE_TEST_SUITE_P(Variants, DeepseekV3Generate, ::testing::ValuesIn(kVariants));

}  // namespace
}  // namespace mt
