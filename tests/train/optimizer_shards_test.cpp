// ZeRO-1's ownership map (train/optimizer_shards.h): whole tensors, largest first onto the least-loaded rank,
// the same map on every rank, the experts left to expert parallelism; and the name helpers a shared save uses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/presets.h"
#include "models/qwen3_moe_config.h"
#include "models/qwen3_moe_weights.h"
#include "train/optimizer_shards.h"

namespace mt {
namespace {

TEST(OptimizerShards, LargestFirstOntoTheLeastLoadedRank) {
  // 50 -> r0; 20 -> r1; 20 -> r1 (20 < 50); 10 -> r1 (40 < 50); 5 -> r0 (50 = 50: the lower rank).
  EXPECT_EQ(OptimizerShards::owners_by_size({10, 50, 20, 20, 5}, 2), (std::vector<int>{1, 0, 1, 1, 0}));
  EXPECT_EQ(OptimizerShards::largest_share({10, 50, 20, 20, 5}, 2), 55);
  EXPECT_EQ(OptimizerShards::owners_by_size({10, 50, 20}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(OptimizerShards::largest_share({10, 50, 20}, 1), 80);
  // More ranks than tensors: one each, the rest own nothing.
  EXPECT_EQ(OptimizerShards::owners_by_size({3, 7}, 4), (std::vector<int>{1, 0}));
  EXPECT_EQ(OptimizerShards::largest_share({3, 7}, 4), 7);
}

TEST(OptimizerShards, UnshardedUpdatesEverything) {
  const OptimizerShards none;
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.owner(size_t{3}), -1);
  EXPECT_EQ(none.owner("anything"), -1);
  EXPECT_TRUE(none.updates(0));
  EXPECT_EQ(none.updated(std::vector<int>{4, 5, 6}), (std::vector<int>{4, 5, 6}));
  const OptimizerShards alone({{"a", 10}, {"b", 20}}, 1, 0, [](const std::string&) { return true; });
  EXPECT_FALSE(alone.active());
  EXPECT_EQ(alone.updated(std::vector<int>{1, 2}), (std::vector<int>{1, 2}));
}

TEST(OptimizerShards, EveryReplicatedParameterHasExactlyOneOwner) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  const Qwen3MoeConfig cfg = Qwen3MoeConfig::from_json(j, "qwen3-moe-test");
  const Qwen3MoeWeights w = Qwen3MoeWeights::empty_like_config(cfg, DType::F32, Device::cpu());
  const auto params = w.named_parameters();
  for (bool split : {false, true})
    for (int world : {2, 3, 4}) {
      SCOPED_TRACE("world " + std::to_string(world) + (split ? ", experts split" : ""));
      std::vector<OptimizerShards> ranks;
      for (int r = 0; r < world; ++r) ranks.push_back(optimizer_shards_for(w, world, r, split));
      std::vector<int64_t> load(static_cast<size_t>(world), 0);
      int64_t total = 0, largest = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& name = params[i].first;
        const int64_t n = params[i].second->numel();
        const bool expert = param_is_stacked_expert(name);
        int updaters = 0;
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(ranks[r].owner(i), ranks[0].owner(i)) << name << ": every rank computes the same map";
          EXPECT_EQ(ranks[r].owner(name), ranks[0].owner(i)) << name;
          updaters += ranks[r].updates(i);
        }
        if (split && expert) {
          EXPECT_EQ(ranks[0].owner(i), -1) << name << ": expert parallelism holds it";
          EXPECT_EQ(updaters, world) << name;
          continue;
        }
        ASSERT_GE(ranks[0].owner(i), 0) << name;
        EXPECT_EQ(updaters, 1) << name;
        load[static_cast<size_t>(ranks[0].owner(i))] += n;
        total += n;
        largest = std::max(largest, n);
      }
      // The largest-first bound: no rank holds more than the average plus one tensor; every rank holds some.
      for (int64_t l : load) {
        EXPECT_GT(l, 0);
        EXPECT_LE(l, total / world + largest);
      }
    }
}

TEST(OptimizerShards, NamesOfStateAndHuggingFaceTensors) {
  EXPECT_EQ(optimizer_state_param("model.norm.weight.exp_avg"), "model.norm.weight");
  EXPECT_EQ(optimizer_state_param("model.norm.weight.exp_avg_sq"), "model.norm.weight");
  EXPECT_EQ(optimizer_state_param("model.layers.0.mlp.experts.down_proj.master"), "model.layers.0.mlp.experts.down_proj");
  EXPECT_EQ(optimizer_state_param("model.norm.weight"), "");
  EXPECT_EQ(optimizer_state_param(".master"), "");
  EXPECT_EQ(hf_tensor_param("model.layers.3.mlp.experts.17.up_proj.weight"), "model.layers.3.mlp.experts.gate_up_proj");
  EXPECT_EQ(hf_tensor_param("model.layers.3.mlp.experts.0.gate_proj.weight"), "model.layers.3.mlp.experts.gate_up_proj");
  EXPECT_EQ(hf_tensor_param("model.layers.3.mlp.experts.5.down_proj.weight"), "model.layers.3.mlp.experts.down_proj");
  EXPECT_EQ(hf_tensor_param("model.embed_tokens.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(hf_tensor_param("model.layers.3.mlp.gate.weight"), "model.layers.3.mlp.gate.weight");
}

}  // namespace
}  // namespace mt
