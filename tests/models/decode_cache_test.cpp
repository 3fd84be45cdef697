// The per-sublayer decode cache and the per-attention-spec RoPE tables: which entries a spec gets and their
// shapes and bytes (Qwen3, Qwen3-MoE, a hand-built spec with several attention configurations and a layer
// without attention), that each attention block reads its own RoPE table, and that the cached layers of a model
// whose layers differ equal the blocks run over the whole sequence with each layer's own table.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/rope.h"
#include "layers/attention_block.h"
#include "layers/mlp_block.h"
#include "layers/rope_table_set.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "models/decode_cache.h"
#include "models/generate.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/qwen3_moe";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Tensor positions(int64_t first, int64_t n) {
  Tensor p = Tensor::empty({n}, DType::I64);
  for (int64_t i = 0; i < n; ++i) p.data_as<int64_t>()[i] = first + i;
  return p;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_floats() == b.to_floats();
}

// Every attention sublayer of a Qwen model has one entry [capacity, kv_heads, head_dim] for k and v; the
// feed-forward sublayers have none; one RoPE table, bitwise the one built from the model's one attention config.
void expect_qwen_cache(const char* variant, int64_t layers, int64_t expected_bytes) {
  SCOPED_TRACE(variant);
  CausalLM m = CausalLM::from_pretrained((kFixtures / variant / "ckpt").string(), {DType::F32});
  const DecoderSpec& c = m.config;
  ASSERT_EQ(c.num_layers(), layers);
  Generator gen(c, m.weights, 10);
  const DecodeCache& cache = gen.cache();
  ASSERT_EQ(cache.entries.size(), static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) {
    const DecodeCacheEntry& e = cache.entries[static_cast<size_t>(l)];
    EXPECT_EQ(e.layer, l);
    EXPECT_EQ(e.sublayer, 0u);
    EXPECT_EQ(e.kind, SublayerKind::attention);
    EXPECT_EQ(e.attention.k.shape(), Shape({10, 2, 16}));
    EXPECT_EQ(e.attention.v.shape(), Shape({10, 2, 16}));
  }
  EXPECT_EQ(cache.bytes(), expected_bytes);
  DecodeCache fresh = DecodeCache::create(c, 10);
  for (int64_t l = 0; l < layers; ++l) {
    EXPECT_EQ(fresh.find(l, 0), &fresh.entries[static_cast<size_t>(l)]);
    EXPECT_EQ(fresh.find(l, 1), nullptr);  // the MLP or MoE sublayer
  }
  for (bool bf16 : {false, true}) {
    const Tensor pos = positions(3, 7);
    const RopeTableSet set = RopeTableSet::build(c, pos, bf16);
    ASSERT_EQ(set.entries.size(), 1u);
    const cpu::RopeTables one = cpu::rope_tables(pos, 16, 10000.0, bf16);
    EXPECT_TRUE(same_bits(set.of(c.attention[0]).cos, one.cos));
    EXPECT_TRUE(same_bits(set.of(c.attention[0]).sin, one.sin));
  }
}

TEST(DecodeCache, Qwen3DenseAndMoeHoldKeysAndValuesPerAttentionSublayer) {
  // dense_qwen3: 2 layers, moe_gqa_aux: 3 (MoE, dense, MoE); both 2 KV heads of 16: 10 positions × 2 × 16 × 4 bytes
  // × (k, v) = 2560 bytes a layer.
  expect_qwen_cache("dense_qwen3", 2, 2 * 2560);
  expect_qwen_cache("moe_gqa_aux", 3, 3 * 2560);
}

// A hand-built model whose layers differ: attention configurations with other head counts, head sizes and RoPE
// bases, one repeated as a second identical configuration (it shares a table), and a layer without attention.
// The Qwen3 parameter table describes one attention configuration, so the weights are built here too.
struct MixedModel {
  DecoderSpec spec;
  ModelWeights w;
};

AttentionSpec gqa(int64_t heads, int64_t kv_heads, int64_t head_dim, double theta) {
  AttentionSpec a;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.qk_norm = true;
  a.rope.theta = theta;
  return a;
}

Tensor random_tensor(const Shape& shape, Rng& rng, double mean, double std) {
  Tensor t = Tensor::empty(shape, DType::F32);
  rng.fill_normal(t.data_as<float>(), t.numel(), mean, std);
  return t;
}

MixedModel mixed_model() {
  MixedModel m;
  DecoderSpec& s = m.spec;
  s.architecture = "test";
  s.vocab_size = 32;
  s.hidden_size = 24;
  s.norm_eps = 1e-6;
  s.max_position_embeddings = 64;
  s.attention = {gqa(4, 2, 8, 1e4), gqa(2, 1, 16, 1e4), gqa(4, 2, 8, 1e6), gqa(4, 2, 8, 1e4)};
  MlpSpec mlp;
  mlp.intermediate_size = 40;
  s.mlp = {mlp};
  using K = SublayerKind;
  s.layers = {{{{K::attention, 0}, {K::mlp, 0}}},
              {{{K::attention, 1}, {K::mlp, 0}}},
              {{{K::mlp, 0}}},  // no attention: nothing cached
              {{{K::attention, 2}, {K::mlp, 0}}},
              {{{K::attention, 3}, {K::mlp, 0}}}};
  Rng rng(7);
  const int64_t H = s.hidden_size, F = mlp.intermediate_size;
  for (const LayerSpec& layer : s.layers) {
    LayerWeights L;
    L.post_norm = random_tensor({H}, rng, 1.0, 0.1);
    L.mlp_gate = random_tensor({F, H}, rng, 0, 0.2);
    L.mlp_up = random_tensor({F, H}, rng, 0, 0.2);
    L.mlp_down = random_tensor({H, F}, rng, 0, 0.2);
    if (layer.sublayers[0].kind == K::attention) {
      const AttentionSpec& a = s.attention[static_cast<size_t>(layer.sublayers[0].index)];
      const int64_t D = a.head_dim;
      L.input_norm = random_tensor({H}, rng, 1.0, 0.1);
      L.q_proj = random_tensor({a.heads * D, H}, rng, 0, 0.3);
      L.k_proj = random_tensor({a.kv_heads * D, H}, rng, 0, 0.3);
      L.v_proj = random_tensor({a.kv_heads * D, H}, rng, 0, 0.3);
      L.o_proj = random_tensor({H, a.heads * D}, rng, 0, 0.3);
      L.q_norm = random_tensor({D}, rng, 1.0, 0.1);
      L.k_norm = random_tensor({D}, rng, 1.0, 0.1);
    }
    m.w.layers.push_back(L);
  }
  return m;
}

BlockEnv env_of(const DecoderSpec& s, int64_t n) {
  BlockEnv env;
  env.spec = &s;
  env.batch = 1;
  env.seq = n;
  return env;
}

// The layers over the whole sequence with the training blocks, each attention layer given a table set holding
// only its own table (built from `theta_of_layer`, normally its spec's base): the reference the cached run matches.
Tensor full_sequence_reference(const MixedModel& m, const Tensor& x,
                               const std::function<double(int64_t)>& theta_of_layer) {
  const DecoderSpec& s = m.spec;
  const int64_t S = x.dim(0);
  Tensor h = x;
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const LayerWeights& L = m.w.layers[static_cast<size_t>(l)];
    for (const Sublayer& sub : s.layers[static_cast<size_t>(l)].sublayers) {
      BlockEnv env = env_of(s, S);
      if (sub.kind == SublayerKind::attention) {
        const AttentionSpec& a = s.attention[static_cast<size_t>(sub.index)];
        env.rope.entries.push_back(
            {a.rope, a.head_dim, cpu::rope_tables(positions(0, S), a.head_dim, theta_of_layer(l), false)});
        h = attention_block_forward(env, a, L, h, nullptr);
      } else {
        h = mlp_block_forward(env, s.mlp[0], L, h, nullptr);
      }
    }
  }
  return h;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_floats(), y = b.to_floats();
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(double(x[i]) - y[i]));
  return d;
}

TEST(DecodeCache, LayersWithOtherAttentionConfigsGetTheirOwnShapes) {
  const MixedModel m = mixed_model();
  const DecodeCache c = DecodeCache::create(m.spec, 12);
  ASSERT_EQ(c.entries.size(), 4u);  // layer 2 has no attention
  const int64_t layers[] = {0, 1, 3, 4};
  const Shape shapes[] = {{12, 2, 8}, {12, 1, 16}, {12, 2, 8}, {12, 2, 8}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(c.entries[i].layer, layers[i]);
    EXPECT_EQ(c.entries[i].sublayer, 0u);
    EXPECT_EQ(c.entries[i].attention.k.shape(), shapes[i]);
    EXPECT_EQ(c.entries[i].attention.v.shape(), shapes[i]);
  }
  DecodeCache c2 = DecodeCache::create(m.spec, 12);
  EXPECT_EQ(c2.find(2, 0), nullptr);
  EXPECT_EQ(c2.find(3, 0), &c2.entries[2]);
  // 12 positions × 4 bytes × (k, v) × (2·8 + 1·16 + 2·8 + 2·8 per position).
  EXPECT_EQ(c.bytes(), 12 * 4 * 2 * (16 + 16 + 16 + 16));

  // A value head size other than the key's gets its own v shape.
  DecoderSpec wide_v = m.spec;
  wide_v.attention[1].v_head_dim = 24;
  EXPECT_EQ(DecodeCache::create(wide_v, 3).entries[1].attention.v.shape(), Shape({3, 1, 24}));
}

TEST(DecodeCache, RopeTablesOnePerDistinctRotation) {
  const MixedModel m = mixed_model();
  const Tensor pos = positions(2, 5);
  const RopeTableSet set = RopeTableSet::build(m.spec, pos, false);
  // (8, 1e4) for configurations 0 and 3, (16, 1e4), (8, 1e6).
  ASSERT_EQ(set.entries.size(), 3u);
  const auto& a = m.spec.attention;
  EXPECT_EQ(&set.of(a[0]), &set.of(a[3]));
  EXPECT_EQ(set.of(a[1]).cos.shape(), Shape({5, 16}));
  EXPECT_TRUE(same_bits(set.of(a[1]).cos, cpu::rope_tables(pos, 16, 1e4, false).cos));
  EXPECT_TRUE(same_bits(set.of(a[2]).sin, cpu::rope_tables(pos, 8, 1e6, false).sin));
  EXPECT_TRUE(same_bits(set.of(a[0]).sin, cpu::rope_tables(pos, 8, 1e4, false).sin));
  EXPECT_FALSE(same_bits(set.of(a[0]).sin, set.of(a[2]).sin));

  // The training attention block with the whole set reads its own table: bitwise what it gives with that table
  // alone.
  Rng rng(3);
  const Tensor x = random_tensor({5, m.spec.hidden_size}, rng, 0, 1);
  for (size_t k = 0; k < a.size(); ++k) {
    const int64_t layer = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? 3 : 4;
    BlockEnv all = env_of(m.spec, 5), alone = env_of(m.spec, 5);
    all.rope = set;
    alone.rope.entries.push_back(
        {a[k].rope, a[k].head_dim, cpu::rope_tables(pos, a[k].head_dim, a[k].rope.theta, false)});
    const LayerWeights& L = m.w.layers[static_cast<size_t>(layer)];
    EXPECT_TRUE(same_bits(attention_block_forward(all, a[k], L, x, nullptr),
                          attention_block_forward(alone, a[k], L, x, nullptr)))
        << "attention configuration " << k;
  }
}

TEST(DecodeCache, CachedLayersEqualFullSequenceWithEachLayersTable) {
  const MixedModel m = mixed_model();
  const int64_t S = 12, H = m.spec.hidden_size;
  Rng rng(5);
  const Tensor x = random_tensor({S, H}, rng, 0, 1);
  const Tensor ref = full_sequence_reference(m, x, [&](int64_t l) {
    return m.spec.attention[static_cast<size_t>(m.spec.layers[static_cast<size_t>(l)].sublayers[0].index)].rope.theta;
  });

  // Prefill 5 rows, then 4 together, then one at a time.
  DecodeCache cache = DecodeCache::create(m.spec, S);
  std::vector<float> got;
  auto run = [&](int64_t first, int64_t n) {
    BlockEnv env = env_of(m.spec, n);
    env.rope = RopeTableSet::build(m.spec, positions(first, n), false);
    const Tensor y = decoder_layers_forward_cached(env, m.w, x.rows(first, first + n), cache);
    const auto v = y.to_floats();
    got.insert(got.end(), v.begin(), v.end());
    EXPECT_EQ(cache.length, first + n);
  };
  run(0, 5);
  run(5, 4);
  for (int64_t i = 9; i < S; ++i) run(i, 1);
  const Tensor cached = Tensor::from_floats({S, H}, got);
  // fp32 GEMMs of 5, 4 and 1 rows against 12: sums associate differently, nothing more (values are O(1);
  // measured 3.8e-6).
  EXPECT_LE(max_abs_diff(cached, ref), 1e-4);

  // The check can fail: layer 3 (base 1e6) run with the base of the others moves the outputs far past it
  // (measured 0.27).
  const Tensor wrong = full_sequence_reference(m, x, [](int64_t) { return 1e4; });
  EXPECT_GE(max_abs_diff(cached, wrong), 1e-2);

  // The cache is full: one more position is a one-line error.
  BlockEnv env = env_of(m.spec, 1);
  env.rope = RopeTableSet::build(m.spec, positions(S, 1), false);
  EXPECT_EQ(error_of([&] { decoder_layers_forward_cached(env, m.w, x.rows(0, 1), cache); }),
            "decode cache: 12 positions held and 1 more do not fit its capacity of 12");
}

// model_config_check checks each attention configuration on its own; several of them are no longer refused.
TEST(DecodeCache, ConfigCheckPerAttentionConfiguration) {
  MixedModel m = mixed_model();
  m.spec.layers[2].sublayers = {{SublayerKind::attention, 1}, {SublayerKind::mlp, 0}};
  EXPECT_EQ(error_of([&] { model_config_check(m.spec); }), "(no error)");
  m.spec.attention[2].sliding_window = 128;  // GPT-OSS's window runs on the CPU
  EXPECT_EQ(error_of([&] { model_config_check(m.spec); }), "(no error)");
  m.spec.attention[2].sliding_window = 0;
  m.spec.attention[3].rope.interleaved = true;
  EXPECT_EQ(error_of([&] { model_config_check(m.spec); }),
            "config: a RoPE other than the half split over the whole head (default or YaRN) is not supported by the "
            "model");
}

// An MLA configuration gets the latent and the rope key of each position instead of keys and values (the DeepSeek-V3
// checkpoints run it in deepseek_v3_generate_test.cpp).
TEST(DecodeCache, MlaSublayerHoldsItsLatentAndRopeKey) {
  const MixedModel m = mixed_model();
  DecoderSpec mla = m.spec;
  AttentionSpec& a = mla.attention[2];
  a.kind = AttentionKind::mla;
  a.kv_lora_rank = 12;
  a.qk_rope_head_dim = 4;
  const DecodeCache c = DecodeCache::create(mla, 5);
  ASSERT_EQ(c.entries.size(), 4u);
  const DecodeCacheEntry& e = c.entries[2];
  EXPECT_EQ(e.layer, 3);
  EXPECT_EQ(e.mla.latent.shape(), Shape({5, 12}));
  EXPECT_EQ(e.mla.k_rot.shape(), Shape({5, 4}));
  EXPECT_FALSE(e.attention.k.defined());
  EXPECT_FALSE(c.entries[1].mla.latent.defined());
  EXPECT_EQ(e.bytes(), 5 * 4 * (12 + 4));
  // The GQA layers as before: 5 positions × 4 bytes × (k, v) × (2·8 + 1·16 + 2·8).
  EXPECT_EQ(c.bytes(), 5 * 4 * (12 + 4) + 5 * 4 * 2 * (16 + 16 + 16));
}

TEST(DecodeCache, RefusesAZeroCapacity) {
  const MixedModel m = mixed_model();
  EXPECT_EQ(error_of([&] { DecodeCache::create(m.spec, 0); }),
            "decode cache: capacity must be >= 1 position, found 0");
}

// A Mamba2 sublayer holds its conv window and its SSM state, whatever the capacity (the Nemotron-H checkpoints run it
// in nemotron_h_generate_test.cpp).
TEST(DecodeCache, Mamba2SublayerHoldsItsWindowAndState) {
  const MixedModel m = mixed_model();
  DecoderSpec mamba = m.spec;
  Mamba2Spec ms;
  ms.heads = 4;
  ms.head_dim = 6;
  ms.groups = 2;
  ms.state = 5;
  ms.conv_kernel = 4;
  ms.chunk = 8;
  mamba.mamba2 = {ms};
  mamba.layers[2].sublayers = {{SublayerKind::mamba2, 0}, {SublayerKind::mlp, 0}};
  for (int64_t capacity : {4, 40}) {
    DecodeCache c = DecodeCache::create(mamba, capacity);
    ASSERT_EQ(c.entries.size(), 5u);
    const DecodeCacheEntry& e = c.entries[2];
    EXPECT_EQ(e.layer, 2);
    EXPECT_EQ(e.kind, SublayerKind::mamba2);
    EXPECT_EQ(c.find(2, 0), &c.entries[2]);
    EXPECT_EQ(c.find(2, 1), nullptr);
    // conv_dim = 4·6 + 2·2·5 = 44 channels × 3 window rows, and 4 × 6 × 5 state values.
    EXPECT_EQ(e.mamba2.conv.shape(), Shape({44, 3}));
    EXPECT_EQ(e.mamba2.ssm.shape(), Shape({4, 6, 5}));
    EXPECT_FALSE(e.attention.k.defined());
    EXPECT_EQ(e.bytes(), 4 * (44 * 3 + 4 * 6 * 5));
    // The GQA layers: capacity × 4 bytes × (k, v) × (2·8 + 1·16 + 2·8 + 2·8).
    EXPECT_EQ(c.bytes(), 4 * (44 * 3 + 4 * 6 * 5) + capacity * 4 * 2 * (16 + 16 + 16 + 16));
  }
}

}  // namespace
}  // namespace mt
