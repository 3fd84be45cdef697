// Every consumer of the parameter table agrees with it, on configs covering MoE, dense, mixed, tied and the real
// Qwen3-30B-A3B shapes: named_parameters() of every allocation, random init, the checkpoint fetch list, the weight
// check, the expert-stack query, the decay rule, inspect's counts, the memory plan's parameter count and bench's
// FLOPs. Where a consumer used to count by its own formula, that formula is kept here as the reference: the
// derived number must be exactly the old one.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/decoder_costs.h"
#include "models/decoder_model.h"
#include "models/model_weights.h"
#include "models/param_table.h"
#include "models/presets.h"
#include "models/registry.h"
#include "train/adamw.h"
#include "train/memory_plan.h"
#include "train/optimizer_shards.h"

namespace mt {
namespace {

DecoderSpec config_of(const std::string& preset, const nlohmann::json& overrides = nlohmann::json::object()) {
  nlohmann::json j = preset_config_json(preset);
  for (const auto& [k, v] : overrides.items()) j[k] = v;
  return DecoderSpec::from_json(j, preset);
}

std::vector<std::pair<std::string, DecoderSpec>> configs() {
  return {
      {"qwen3-moe-test", config_of("qwen3-moe-test")},
      {"mixed+tied", config_of("qwen3-moe-test", {{"num_hidden_layers", 4},
                                                  {"mlp_only_layers", {0, 3}},
                                                  {"tie_word_embeddings", true}})},
      {"sparse step 2", config_of("qwen3-moe-test", {{"num_hidden_layers", 3}, {"decoder_sparse_step", 2}})},
      {"dense qwen3", config_of("qwen3-moe-test", {{"architectures", {"Qwen3ForCausalLM"}},
                                                   {"model_type", "qwen3"},
                                                   {"num_experts", 0},
                                                   {"num_experts_per_tok", 0}})},
      {"qwen3-moe-tiny", config_of("qwen3-moe-tiny")},
      {"qwen3-30b-a3b", config_of("qwen3-30b-a3b")},
  };
}

bool small(const DecoderSpec& c) { return c.vocab_size * c.hidden_size < (int64_t{1} << 24); }

// ---- the formulas the consumers had before the table (kept as references) ----

// cli/cmd_inspect.cpp count_params.
ParamCounts old_inspect_counts(const DecoderSpec& c) {
  ParamCounts p;
  const int64_t H = c.hidden_size, D = c.only_attention().head_dim;
  const int64_t attn = H * c.only_attention().heads * D * 2 + H * c.only_attention().kv_heads * D * 2 + 2 * D + 2 * H;
  p.embedding = c.vocab_size * H * (c.tie_word_embeddings ? 1 : 2);
  p.total = p.embedding + H;
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    p.total += attn;
    if (c.is_moe_layer(l)) {
      const int64_t e = c.num_experts() * 3 * H * c.only_moe().expert.intermediate_size;
      p.experts += e;
      p.total += e + c.num_experts() * H;
      p.active -= (c.num_experts() - c.experts_per_token()) * 3 * H * c.only_moe().expert.intermediate_size;
    } else {
      p.total += 3 * H * c.only_mlp().intermediate_size;
    }
  }
  p.active += p.total;
  return p;
}

// train/cuda/bench_run.cpp bench_flops_per_token (now models/decoder_costs.h decoder_train_flops_per_token).
double old_bench_flops_per_token(const DecoderSpec& c, int64_t seq) {
  const double H = static_cast<double>(c.hidden_size), D = static_cast<double>(c.only_attention().head_dim);
  const AttentionSpec& a = c.only_attention();
  const double Hq = static_cast<double>(a.heads), Hkv = static_cast<double>(a.kv_heads);
  double per_token = 0;
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    const double proj = H * Hq * D * 2 + H * Hkv * D * 2;
    const double mlp = c.is_moe_layer(l) ? static_cast<double>(c.experts_per_token()) * 3.0 * H *
                                               static_cast<double>(c.only_moe().expert.intermediate_size)
                                         : 3.0 * H * static_cast<double>(c.only_mlp().intermediate_size);
    per_token += 6.0 * (proj + mlp) + 6.0 * static_cast<double>(seq) * Hq * D;
  }
  return per_token + 6.0 * static_cast<double>(c.vocab_size) * H;
}

// FNV-1a over (name, bytes) of every parameter of random_init(qwen3-moe-test, F32, seed 1234), in
// named_parameters() order, as the code before the table (3572fad, linked into a 15-line program) computed it.
constexpr uint64_t kRandomInitHash = 13179619691432260434ull;

// ---- the tests ----

TEST(ParamTableConsumers, AllocationsListTheTable) {
  for (const auto& [what, cfg] : configs()) {
    SCOPED_TRACE(what);
    const ParamTable t = param_table_of(cfg);
    const int64_t held = cfg.num_experts() > 0 ? cfg.num_experts() / 2 : -1;
    std::vector<std::pair<const char*, ModelWeights>> made;
    made.emplace_back("absent", ModelWeights::absent_like_config(cfg, DType::BF16));
    made.emplace_back("absent held", ModelWeights::absent_like_config(cfg, DType::BF16, Device::cpu(), held));
    if (small(cfg)) {
      made.emplace_back("zeros", ModelWeights::zeros_like_config(cfg, DType::F32));
      made.emplace_back("zeros held", ModelWeights::zeros_like_config(cfg, DType::F32, held));
      made.emplace_back("empty", ModelWeights::empty_like_config(cfg, DType::BF16, Device::cpu()));
      made.emplace_back("random", ModelWeights::random_init(cfg, DType::F32, 5));
    }
    for (auto& [how, w] : made) {
      SCOPED_TRACE(how);
      const bool sliced = std::string(how).ends_with("held");
      const auto named = w.named_parameters();
      ASSERT_EQ(named.size(), t.entries().size());
      std::set<const Tensor*> distinct;
      for (size_t i = 0; i < named.size(); ++i) {
        const ParamEntry& e = t.entries()[i];
        EXPECT_EQ(named[i].first, e.name);
        EXPECT_EQ(named[i].second, &w.slot(e)) << e.name;
        EXPECT_EQ(named[i].second->shape(), param_shape_held(e, sliced ? held : -1)) << e.name;
        distinct.insert(named[i].second);
      }
      EXPECT_EQ(distinct.size(), named.size());
      // The weight check the models run accepts what the factories make.
      const DType dt = named.empty() ? DType::F32 : named[0].second->dtype();
      weights_check(cfg, w, "parameter", dt, Device::cpu(), sliced ? held : -1);
    }
  }
}

TEST(ParamTableConsumers, WeightCheckNamesTheEntryThatDiffers) {
  const DecoderSpec cfg = config_of("qwen3-moe-test");
  ModelWeights w = ModelWeights::zeros_like_config(cfg, DType::F32);
  w.layers[1].k_norm = Tensor::zeros({17}, DType::F32);
  try {
    weights_check(cfg, w, "gradient", DType::F32, Device::cpu());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient model.layers.1.self_attn.k_norm.weight: expected shape [16]"),
              std::string::npos)
        << e.what();
  }
}

// Norms 1 (the entries with init ones: the names with "norm.weight", as before), everything else normal(0, σ)
// from one stream per name; pinned bitwise to the values the code before the table drew (kRandomInitHash).
TEST(ParamTableConsumers, RandomInitFollowsTheInitRule) {
  const DecoderSpec cfg = config_of("qwen3-moe-test");
  const ModelWeights w = ModelWeights::random_init(cfg, DType::F32, 1234);
  uint64_t h = 1469598103934665603ull;
  auto hash = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const ParamEntry& e : w.param_table().entries()) {
    EXPECT_EQ(e.init == ParamInit::ones, e.name.find("norm.weight") != std::string::npos) << e.name;
    const Tensor& t = w.slot(e);
    const std::vector<float> v = t.to_floats();
    if (e.init == ParamInit::ones) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << e.name;
    }
    hash(e.name.data(), e.name.size());
    hash(t.data(), t.nbytes());
  }
  EXPECT_EQ(h, kRandomInitHash);
}

TEST(ParamTableConsumers, CheckpointFetchListIsTheSaveList) {
  for (const auto& [what, cfg] : configs()) {
    if (!small(cfg)) continue;
    SCOPED_TRACE(what);
    const ModelWeights w = ModelWeights::random_init(cfg, DType::F32, 3);
    std::map<std::string, Tensor> saved;
    std::vector<std::string> names;
    for (auto& [n, t] : w.to_hf(cfg)) {
      saved[n] = t;
      names.push_back(n);
    }
    std::set<std::string> fetched;
    auto lookup = [&](const std::string& n) {
      fetched.insert(n);
      auto it = saved.find(n);
      return it == saved.end() ? Tensor() : it->second;
    };
    const ModelWeights got = ModelWeights::from_hf(cfg, DType::F32, lookup, names, "mem/");
    EXPECT_EQ(fetched, std::set<std::string>(names.begin(), names.end()));
    const auto a = w.named_parameters(), b = got.named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_EQ(a[i].second->to_floats(), b[i].second->to_floats()) << a[i].first;
    }
    // Every stored tensor missing in turn is named, with the shape the table implies.
    for (const std::string& gone : {names.front(), names.back()}) {
      std::vector<std::string> fewer;
      for (const std::string& n : names)
        if (n != gone) fewer.push_back(n);
      try {
        ModelWeights::from_hf(cfg, DType::F32, [&](const std::string& n) { return n == gone ? Tensor() : lookup(n); },
                                 fewer, "mem/");
        ADD_FAILURE() << gone << ": no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("tensor '" + gone + "' is missing"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(ParamTableConsumers, RolesAndRulesAgreeWithTheNameRulesTheyReplace) {
  for (const auto& [what, cfg] : configs()) {
    SCOPED_TRACE(what);
    const ParamTable t = param_table_of(cfg);
    for (const ParamEntry& e : t.entries()) {
      // The ".mlp.experts." pattern param_is_stacked_expert used, for parameters and their optimizer state.
      const bool old_stack = e.name.find(".mlp.experts.") != std::string::npos;
      EXPECT_EQ(t.is_expert_stack(e.name), old_stack) << e.name;
      for (const char* state : {"", ".exp_avg", ".exp_avg_sq", ".master"})
        EXPECT_EQ(param_is_stacked_expert(t, e.name + state), old_stack) << e.name << state;
      // HF Trainer's decay rule as the optimizer applies it by name.
      EXPECT_EQ(e.decay, adamw_hf_decays(e.name)) << e.name;
      // bench's device init: ones where the name has "norm".
      EXPECT_EQ(e.init == ParamInit::ones, e.name.find("norm") != std::string::npos) << e.name;
    }
  }
}

TEST(ParamTableConsumers, InspectAndBenchCountsAreTheOldFormulas) {
  for (const auto& [what, cfg] : configs()) {
    SCOPED_TRACE(what);
    const ParamCounts have = param_counts(param_table_of(cfg)), want = old_inspect_counts(cfg);
    EXPECT_EQ(have.total, want.total);
    EXPECT_EQ(have.experts, want.experts);
    EXPECT_EQ(have.active, want.active);
    EXPECT_EQ(have.embedding, want.embedding);
    EXPECT_EQ(have.total, ModelWeights::absent_like_config(cfg, DType::BF16).parameter_count());
    for (int64_t seq : {1, 128, 4096, 131072})
      EXPECT_EQ(decoder_train_flops_per_token(cfg, seq), old_bench_flops_per_token(cfg, seq)) << "seq " << seq;
  }
}

TEST(ParamTableConsumers, MemoryPlanCountsTheTable) {
  for (const auto& [what, cfg] : configs()) {
    SCOPED_TRACE(what);
    const ParamCounts c = param_counts(param_table_of(cfg));
    MemoryPlanInput in;
    in.cfg = cfg;
    in.micro_batch = 1;
    in.seq = 128;
    in.device_bytes = int64_t{80} << 30;
    const MemoryPlan whole = memory_plan(in);
    EXPECT_EQ(whole.param_count, c.total);
    EXPECT_EQ(whole.grads, 4 * c.total);
    EXPECT_EQ(whole.params, 2 * c.total);
    if (cfg.num_experts() >= 2 && c.experts > 0) {
      in.expert_parallel = 2;
      EXPECT_EQ(memory_plan(in).param_count, c.total - c.experts + c.experts / 2);
    }
  }
}

}  // namespace
}  // namespace mt
