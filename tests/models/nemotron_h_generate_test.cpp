// Generation for Nemotron-H with the Mamba2 decode cache (layers/mamba2_mixer_block_cached.h) on the tiny checkpoints
// of tests/fixtures/nemotron_h (hybrid_all_kinds: Mamba2, MoE, attention and MLP layers, 2 groups; one_group_dt_clamp_
// pattern: 1 group; both chunk 8, conv kernel 4): the cached logits at every position equal the full forward's, the
// cache holds a conv window and an SSM state per Mamba2 layer whatever the length, a prefill leaves the state a token
// by token run leaves, greedy decoding equals an argmax of the full forward at each step and Transformers' generate()
// (generate.json, made by tools/hf_reference/make_family_fixtures.py --family nemotron_h), and seeded sampling is
// reproducible.
//
// The fp32 tolerance. A cached run computes what the full forward computes, op for op, except (a) the GEMMs see 1 row,
// or the prompt's rows, instead of the whole sequence, so OpenBLAS may sum in another order (DeepSeek-V3's cache test
// measured ≤ 1.5e-5 on logits up to 7.3 from this alone), and (b) after the prompt each Mamba2 layer runs the
// recurrence S = S·exp(dt·A) + (dt·B)⊗x, y = S·C + D·x instead of the chunked scan's matrix form. Both forms sum the
// same products: y_t = Σ_{s≤t} Σ_n C_t,n·B_s,n·dt_s·x_s·exp(Σ_{s<r≤t} dt_r·A) + D·x_t, m = t·N ≤ 32·16 = 512 terms
// of ≤ 6 rounded factors each (exp of a sum of ≤ 32 rounded terms), so each y differs by at most about
// (m + 40)·u·Σ|terms| ≈ 3.3e-5·Σ|terms| (u = 2^-24), and typically by √m·u ≈ 1.3e-6 of it (rounding errors of random
// sign). That relative error passes the gated RMSNorm (scale-free), out_proj, the residual and the later layers at
// about its size again relative to the logits (each layer adds its output to a residual of comparable norm), so with
// logits up to ~8 the worst case is ~2.6e-4 absolute and the typical error ~1e-5. We allow max abs 1e-4 (10 × the
// typical error, under the worst case) and rel L2 1e-5 (8 × the typical relative error). Measured on this machine's
// OpenBLAS over both checkpoints, 3 sequences and 4 prompt splits: max abs ≤ 6.5e-6 (logits up to 7.9), rel L2
// ≤ 5.4e-7.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/rng.h"
#include "layers/mamba2_mixer_block.h"
#include "layers/mamba2_mixer_block_cached.h"
#include "models/causal_lm.h"
#include "models/generate.h"
#include "hf_fixture_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using test::full_forward_logits;
using test::random_ids;
using test::rel_norm_error;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/nemotron_h";
const char* kVariants[] = {"hybrid_all_kinds", "one_group_dt_clamp_pattern"};

constexpr double kFp32MaxAbs = 1e-4, kFp32RelL2 = 1e-5;

CausalLM load(const char* variant, DType dtype) {
  return CausalLM::from_pretrained((kFixtures / variant / "ckpt").string(), {dtype});
}

// The prompt ids[0, prompt) in one extend, then `chunk` ids together (a continuation at offset > 0; 0: none), then
// one id per step: the logits of every position, [S, V] flattened.
std::vector<float> cached_logits(CausalLM& m, const std::vector<int64_t>& ids, size_t prompt, size_t chunk) {
  Generator gen(m.config, m.weights, static_cast<int64_t>(ids.size()));
  std::vector<float> out;
  auto append = [&](const Tensor& t) {
    const auto v = t.to_floats();
    out.insert(out.end(), v.begin(), v.end());
  };
  append(gen.extend({ids.begin(), ids.begin() + prompt}, true));
  if (chunk > 0) append(gen.extend({ids.begin() + prompt, ids.begin() + prompt + chunk}, true));
  for (size_t i = prompt + chunk; i < ids.size(); ++i) append(gen.decode_step(ids[i]));
  EXPECT_EQ(gen.length(), static_cast<int64_t>(ids.size()));
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

class NemotronHGenerate : public ::testing::TestWithParam<const char*> {};

// Prompts of 1 token, 5 tokens and 20 tokens (chunk 8: the prefill crosses two chunk boundaries) of a 32-token
// sequence, the rest one token a step; and a prompt of 5 followed by 4 ids in one extend. Three random sequences.
TEST_P(NemotronHGenerate, CachedLogitsEqualFullForwardFp32) {
  CausalLM m = load(GetParam(), DType::F32);
  ASSERT_EQ(m.config.mamba2.at(0).chunk, 8);
  for (uint64_t seed : {41, 42, 43}) {
    const auto ids = random_ids(32, m.config.vocab_size, seed);
    const auto ref = full_forward_logits(m, ids);
    for (auto [prompt, chunk] : {std::pair<size_t, size_t>{1, 0}, {5, 0}, {20, 0}, {5, 4}}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", prompt " << prompt << ", then " << chunk);
      const auto got = cached_logits(m, ids, prompt, chunk);
      ASSERT_EQ(got.size(), ref.size());
      const double diff = test::max_abs_diff(got, ref), rel = rel_norm_error(got, ref);
      std::printf("%s seed %llu prompt %zu+%zu: cached vs full forward logits: max abs %.3g (logits up to %.3g), "
                  "rel L2 %.3g\n",
                  GetParam(), static_cast<unsigned long long>(seed), prompt, chunk, diff, max_abs(ref), rel);
      EXPECT_LE(diff, kFp32MaxAbs);
      EXPECT_LE(rel, kFp32RelL2);
    }
  }
}

// bf16: the prompt's positions run the training block (the full forward's rounding points), the later ones
// Transformers' decode rounding (each conv tap, dt·B, (dt·B)·x, the state cast to bf16 before S·C, y, D·x, the gated
// norm's normalised value), a different set of bf16 roundings of the same fp32 computation. Two bf16 evaluations that
// each sit at about the bf16 model's distance e from the fp32 one, with independent rounding errors, sit about √2·e
// from each other: we allow 1.5·e between the cached and the full bf16 logits, and 1.5·e between the cached bf16 and
// the fp32 logits (the decode rounding is no worse than the forward's). Measured: e = 0.0164 and 0.0138 (rel L2);
// cached vs full bf16 0.0115 and 0.0043, cached bf16 vs fp32 0.0167 and 0.0137; the prompt's logits bit-identical.
TEST_P(NemotronHGenerate, CachedLogitsNearFullForwardBf16) {
  CausalLM m = load(GetParam(), DType::BF16);
  const auto ids = random_ids(24, m.config.vocab_size, 44);
  const auto ref = full_forward_logits(m, ids);
  const auto got = cached_logits(m, ids, 6, 0);
  ASSERT_EQ(got.size(), ref.size());
  const size_t V = static_cast<size_t>(m.config.vocab_size), prompt_values = 6 * V;
  const std::vector<float> got_prompt(got.begin(), got.begin() + prompt_values),
      ref_prompt(ref.begin(), ref.begin() + prompt_values);
  CausalLM m32 = load(GetParam(), DType::F32);
  const auto ref32 = full_forward_logits(m32, ids);
  const double e = rel_norm_error(ref, ref32);
  std::printf("%s bf16: prompt rel L2 %.3g; all positions: cached vs full bf16 rel L2 %.3g, full bf16 vs fp32 %.3g, "
              "cached bf16 vs fp32 %.3g\n",
              GetParam(), rel_norm_error(got_prompt, ref_prompt), rel_norm_error(got, ref), e,
              rel_norm_error(got, ref32));
  // The prompt: the training block's rounding points; only GEMM row counts differ (an fp32 reassociation may flip a
  // bf16 rounding now and then: one ulp, 2^-8, in L2).
  EXPECT_LE(rel_norm_error(got_prompt, ref_prompt), 4e-3);
  EXPECT_LE(rel_norm_error(got, ref), 1.5 * e);
  EXPECT_LE(rel_norm_error(got, ref32), 1.5 * e);
}

// Per Mamba2 layer a [conv_dim, K−1] window and a [heads, head_dim, state] state, the same for any capacity; the
// attention layer's keys and values grow with it.
TEST_P(NemotronHGenerate, CacheHoldsAWindowAndAStatePerMamba2Layer) {
  CausalLM m = load(GetParam(), DType::F32);
  const DecoderSpec& c = m.config;
  const Mamba2Spec& ms = c.mamba2.at(0);
  const int64_t C = ms.conv_dim(), K = ms.conv_kernel;
  const int64_t mamba_bytes = 4 * (C * (K - 1) + ms.heads * ms.head_dim * ms.state);
  int64_t mamba_layers = 0, attention_layers = 0;
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    mamba_layers += c.mamba2_of(l) != nullptr;
    for (const Sublayer& s : c.layers[static_cast<size_t>(l)].sublayers)
      attention_layers += s.kind == SublayerKind::attention;
  }
  ASSERT_EQ(mamba_layers, 2);
  ASSERT_EQ(attention_layers, 1);
  const AttentionSpec& a = c.attention.at(0);
  for (int64_t capacity : {3, 30}) {
    Generator gen(c, m.weights, capacity);
    const DecodeCache& cache = gen.cache();
    ASSERT_EQ(cache.entries.size(), 3u);
    for (const DecodeCacheEntry& e : cache.entries) {
      if (e.kind != SublayerKind::mamba2) continue;
      EXPECT_EQ(e.mamba2.conv.shape(), Shape({C, K - 1}));
      EXPECT_EQ(e.mamba2.ssm.shape(), Shape({ms.heads, ms.head_dim, ms.state}));
      EXPECT_EQ(e.bytes(), mamba_bytes);
    }
    EXPECT_EQ(cache.bytes(), 2 * mamba_bytes + capacity * 4 * 2 * a.kv_heads * a.head_dim);
  }

  // A 2-token prompt fills the window's last two rows; its first row stays zero (before the first token).
  Generator gen(c, m.weights, 10);
  gen.prefill({5, 17});
  for (const DecodeCacheEntry& e : gen.cache().entries) {
    if (e.kind != SublayerKind::mamba2) continue;
    const auto w = e.mamba2.conv.to_floats();
    double first = 0, rest = 0;
    for (int64_t ch = 0; ch < C; ++ch) {
      first = std::max(first, std::fabs(double(w[ch * (K - 1)])));
      for (int64_t j = 1; j < K - 1; ++j) rest = std::max(rest, std::fabs(double(w[ch * (K - 1) + j])));
    }
    EXPECT_EQ(first, 0.0);
    EXPECT_GT(rest, 0.0);
    EXPECT_GT(max_abs(e.mamba2.ssm.to_floats()), 0.0);
  }
}

// One Mamba2 block (layer 0's weights): the prompt's 20 rows in one prefill leave the window and the state that
// 20 one-row calls leave (the state up to fp32 rounding: the chunked final state against the recurrence, the
// bound of the header; the window holds in_proj outputs, equal up to the GEMM's row count), and the outputs agree.
TEST_P(NemotronHGenerate, PrefillLeavesTheStateATokenByTokenRunLeaves) {
  CausalLM m = load(GetParam(), DType::F32);
  const DecoderSpec& c = m.config;
  int64_t layer = 0;
  while (c.mamba2_of(layer) == nullptr) ++layer;
  const Mamba2Spec& ms = *c.mamba2_of(layer);
  const LayerWeights& L = m.weights.layers[static_cast<size_t>(layer)];
  const int64_t n = 20, H = c.hidden_size;
  Rng rng(45);
  Tensor x = Tensor::empty({n, H}, DType::F32);
  rng.fill_normal(x.data_as<float>(), x.numel(), 0.0, 1.0);
  auto env_of = [&](int64_t rows) {
    BlockEnv env;
    env.spec = &c;
    env.batch = 1;
    env.seq = rows;
    return env;
  };
  Mamba2Cache whole = Mamba2Cache::create(ms), steps = Mamba2Cache::create(ms);
  const auto y_whole = mamba2_block_forward_cached(env_of(n), ms, L, x, 0, whole).to_floats();
  std::vector<float> y_steps;
  for (int64_t t = 0; t < n; ++t) {
    const auto y = mamba2_block_forward_cached(env_of(1), ms, L, x.rows(t, t + 1), t, steps).to_floats();
    y_steps.insert(y_steps.end(), y.begin(), y.end());
  }
  // The prompt's output is the training block's, bit for bit.
  EXPECT_EQ(y_whole, mamba2_block_forward(env_of(n), ms, L, x, nullptr).to_floats());
  const auto sw = whole.ssm.to_floats(), ss = steps.ssm.to_floats();
  const double state_diff = test::max_abs_diff(ss, sw), window_diff =
                                test::max_abs_diff(steps.conv.to_floats(), whole.conv.to_floats());
  std::printf("%s: state max abs %.3g (up to %.3g), window max abs %.3g, outputs max abs %.3g\n", GetParam(),
              state_diff, max_abs(sw), window_diff, test::max_abs_diff(y_steps, y_whole));
  EXPECT_LE(state_diff, 3.3e-5 * std::max(1.0, max_abs(sw)));
  EXPECT_LE(window_diff, 1e-5 * std::max(1.0, max_abs(whole.conv.to_floats())));
  EXPECT_LE(test::max_abs_diff(y_steps, y_whole), 3.3e-5 * std::max(1.0, max_abs(y_whole)));
  EXPECT_GT(max_abs(sw), 0.0);
}

// The slow reference: for each new token, forward() over everything so far, argmax of the last row.
TEST_P(NemotronHGenerate, GreedyEqualsArgmaxOfFullForwardEachStep) {
  CausalLM m = load(GetParam(), DType::F32);
  test::expect_greedy_equals_full_forward_argmax(m, random_ids(9, m.config.vocab_size, 46));
}

// Transformers' greedy generate() (fp32, use_cache=True: its torch path's chunked prefill, then its decode branch one
// token a step), prompts of 6, 11 and 37 tokens (37 crosses four chunks of 8), 12 new tokens each.
TEST_P(NemotronHGenerate, GreedyEqualsTransformersGoldens) {
  const fs::path dir = kFixtures / GetParam();
  if (!fs::exists(dir / "generate.json"))
    GTEST_SKIP() << (dir / "generate.json").string()
                 << " is absent: make it with tools/hf_reference/make_family_fixtures.py --family nemotron_h";
  test::expect_greedy_equals_goldens(dir);
}

TEST_P(NemotronHGenerate, SamplingIsSeededAndTopK1IsGreedy) {
  CausalLM m = load(GetParam(), DType::F32);
  test::expect_sampling_seeded_and_top_k1_greedy(m, random_ids(4, m.config.vocab_size, 47));
}

INSTANTIATE_TEST_SUITE_P(Variants, NemotronHGenerate, ::testing::ValuesIn(kVariants));

}  // namespace
}  // namespace mt
