// Hostile config.json files: seeded random mutations of a valid config must either parse or
// throw mt::Error with a one-line message naming the file; never crash or throw anything else.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/rng.h"
#include "models/decoder_model.h"
#include "models/registry.h"
#include "models/spec/decoder_spec.h"

namespace mt {
namespace {

using nlohmann::json;

json valid_config() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 24, "moe_intermediate_size": 8, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
    "decoder_sparse_step": 1, "mlp_only_layers": [1], "norm_topk_prob": true, "torch_dtype": "bfloat16",
    "rope_theta": 1000000.0, "rope_scaling": null, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "use_sliding_window": false, "attention_bias": false, "tie_word_embeddings": false,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "max_position_embeddings": 128,
    "router_aux_loss_coef": 0.001, "initializer_range": 0.02, "output_router_logits": false
  })");
}

json random_value(Rng& rng, int depth) {
  switch (rng.next_u64() % 14) {
    case 0: return nullptr;
    case 1: return rng.next_u64() % 2 == 0;
    case 2: return static_cast<int64_t>(rng.next_u64() % 64) - 8;
    case 3: return std::numeric_limits<int64_t>::max();
    case 4: return std::numeric_limits<int64_t>::min();
    case 5: return std::numeric_limits<uint64_t>::max();
    case 6: return (rng.uniform() - 0.5) * 1e300;
    case 7: return 2.0;
    case 8: return std::string("silu");
    case 9: return std::string("\xff\xfe bad utf8");
    case 10: return std::string(rng.next_u64() % 300, 'x');
    case 11: return "Qwen3ForCausalLM";
    case 12: {
      json a = json::array();
      if (depth < 6)
        for (uint64_t i = rng.next_u64() % 4; i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      if (depth < 6) {
        o["rope_type"] = random_value(rng, depth + 1);
        o["type"] = random_value(rng, depth + 1);
        o["rope_theta"] = random_value(rng, depth + 1);
      }
      return o;
    }
  }
}

// One to three mutations of `j`: replace a value, delete a key, or mutate inside a nested value.
void mutate(json& j, Rng& rng) {
  for (uint64_t n = 1 + rng.next_u64() % 3; n > 0; --n) {
    if (!j.is_object() || j.empty()) return;
    auto it = j.begin();
    std::advance(it, static_cast<long>(rng.next_u64() % j.size()));
    switch (rng.next_u64() % 4) {
      case 0: j.erase(it); break;
      case 1: *it = random_value(rng, 0); break;
      case 2:
        if (it->is_array() && !it->empty())
          (*it)[rng.next_u64() % it->size()] = random_value(rng, 0);
        else if (it->is_object())
          (*it)["rope_type"] = random_value(rng, 0);
        else
          *it = json::array({*it});
        break;
      default: j[std::string("junk_") + std::to_string(rng.next_u64() % 5)] = random_value(rng, 0); break;
    }
  }
}

void expect_clean_outcome(const std::function<void()>& parse, const std::string& file, uint64_t iter) {
  try {
    parse();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind(file + ": ", 0), 0u) << "iteration " << iter << ": " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "iteration " << iter << ": " << m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "iteration " << iter << ": non-mt::Error exception: " << e.what();
  }
}

TEST(DecoderSpecFuzz, MutatedJson) {
  Rng rng(20240601);
  const json base = valid_config();
  ASSERT_NO_THROW(DecoderSpec::from_json(base, "fuzz.json"));
  int parsed = 0;
  for (uint64_t iter = 0; iter < 4000; ++iter) {
    json j = base;
    mutate(j, rng);
    bool ok = false;
    expect_clean_outcome(
        [&] {
          DecoderSpec c = DecoderSpec::from_json(j, "fuzz.json");
          ok = true;
          // A config that parses must be self-consistent and survive a to_json round trip.
          EXPECT_GT(c.only_attention().head_dim, 0);
          EXPECT_EQ(c.only_attention().heads % c.only_attention().kv_heads, 0);
          EXPECT_LE(c.experts_per_token(), c.num_experts());
          DecoderSpec back = DecoderSpec::from_json(c.to_json(), "fuzz.json");
          EXPECT_EQ(back.to_json(), c.to_json());
        },
        "fuzz.json", iter);
    parsed += ok;
  }
  // Both outcomes must actually occur, or the mutations are not exercising anything.
  EXPECT_GT(parsed, 100);
  EXPECT_LT(parsed, 3900);
}

// DeepSeek-V3's two fixture configs (v5 and hub spellings): the same mutations; a config that parses also passes
// the CPU engine's config check (or says in one line why not), gives a parameter table and round-trips to_json.
TEST(DecoderSpecFuzz, MutatedDeepseekV3Json) {
  Rng rng(20261206);
  int parsed = 0, total = 0;
  for (const char* variant : {"mla_yarn_dense1", "plain_q_legacy_config"}) {
    std::ifstream in(std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/deepseek_v3/" + variant + "/ckpt/config.json");
    const json base = json::parse(in);
    ASSERT_NO_THROW(DecoderSpec::from_json(base, "fuzz.json"));
    for (uint64_t iter = 0; iter < 2000; ++iter, ++total) {
      json j = base;
      mutate(j, rng);
      bool ok = false;
      expect_clean_outcome(
          [&] {
            DecoderSpec c = DecoderSpec::from_json(j, "fuzz.json");
            ok = true;
            const AttentionSpec& a = c.only_attention();
            EXPECT_EQ(a.head_dim, a.qk_nope_head_dim + a.qk_rope_head_dim);
            EXPECT_EQ(a.rope.rotary_dim, a.qk_rope_head_dim);
            EXPECT_LE(c.experts_per_token(), c.num_experts());
            try {
              model_config_check(c);
            } catch (const Error& e) {
              ADD_FAILURE() << "iteration " << iter << ": parsed but refused by the engine: " << e.what();
            }
            EXPECT_FALSE(param_table_of(c).entries().empty());
            DecoderSpec back = DecoderSpec::from_json(c.to_json(), "fuzz.json");
            EXPECT_EQ(back.to_json(), c.to_json());
          },
          "fuzz.json", iter);
      parsed += ok;
    }
  }
  EXPECT_GT(parsed, 100);
  EXPECT_LT(parsed, total - 100);
}

// Nemotron-H's two fixture configs (v5 layers_block_type and hub hybrid_override_pattern spellings): the same
// mutations; a config that parses passes the CPU engine's config check, gives a parameter table and round-trips
// to_json.
TEST(DecoderSpecFuzz, MutatedNemotronHJson) {
  Rng rng(20261207);
  int parsed = 0, total = 0;
  for (const char* variant : {"hybrid_all_kinds", "one_group_dt_clamp_pattern"}) {
    std::ifstream in(std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/nemotron_h/" + variant + "/ckpt/config.json");
    const json base = json::parse(in);
    ASSERT_NO_THROW(DecoderSpec::from_json(base, "fuzz.json"));
    for (uint64_t iter = 0; iter < 2000; ++iter, ++total) {
      json j = base;
      mutate(j, rng);
      bool ok = false;
      expect_clean_outcome(
          [&] {
            DecoderSpec c = DecoderSpec::from_json(j, "fuzz.json");
            ok = true;
            EXPECT_GE(c.num_layers(), 1);
            EXPECT_LE(c.experts_per_token(), c.num_experts());
            for (const Mamba2Spec& m : c.mamba2) EXPECT_EQ(m.heads % m.groups, 0);
            try {
              model_config_check(c);
            } catch (const Error& e) {
              ADD_FAILURE() << "iteration " << iter << ": parsed but refused by the engine: " << e.what();
            }
            EXPECT_FALSE(param_table_of(c).entries().empty());
            DecoderSpec back = DecoderSpec::from_json(c.to_json(), "fuzz.json");
            EXPECT_EQ(back.to_json(), c.to_json());
          },
          "fuzz.json", iter);
      parsed += ok;
    }
  }
  EXPECT_GT(parsed, 100);
  EXPECT_LT(parsed, total - 100);
}

TEST(DecoderSpecFuzz, TruncatedAndCorruptedText) {
  Rng rng(7);
  const std::string text = valid_config().dump(2);
  const std::string path = testing::TempDir() + "/mixtune_cfg_fuzz.json";
  for (uint64_t iter = 0; iter < 600; ++iter) {
    std::string t = text;
    if (iter % 2 == 0) {
      t.resize(rng.next_u64() % t.size());
    } else {
      for (int k = 0; k < 3; ++k) t[rng.next_u64() % t.size()] = static_cast<char>(rng.next_u64() % 256);
    }
    if (iter % 50 == 0) t = std::string(20000, '[');  // deep nesting
    {
      std::ofstream f(path, std::ios::binary);
      f << t;
    }
    expect_clean_outcome([&] { DecoderSpec::from_file(path); }, path, iter);
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace mt
