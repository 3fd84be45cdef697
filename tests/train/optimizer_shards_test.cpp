// ZeRO-1's ownership map (train/optimizer_shards.h): whole tensors, largest first onto the least-loaded rank,
// the same map on every rank; the expert stacks under expert parallelism sharded over their replicas (or left
// to each rank when there is one copy of each expert group); and the name helpers a shared save uses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/presets.h"
#include "models/spec/decoder_spec.h"
#include "models/model_weights.h"
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

// Every layout the engines accept (ep dividing the world): each replicated parameter has one owner among the
// world, the same on every rank, and the owners of the map without expert replicas (the expert-less constructor)
// are unchanged; with ep > 1 and world > ep each expert stack has one owner among the ranks holding the same
// experts, at the same replica position in every replica group; with world = ep each rank updates its own.
TEST(OptimizerShards, EveryReplicatedParameterHasExactlyOneOwner) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  const DecoderSpec cfg = DecoderSpec::from_json(j, "qwen3-moe-test");
  const ModelWeights w = ModelWeights::empty_like_config(cfg, DType::F32, Device::cpu());
  const auto params = w.named_parameters();
  const std::vector<std::pair<int, int64_t>> layouts = {{2, 1}, {3, 1}, {4, 1}, {2, 2}, {4, 2}, {6, 2}, {8, 4}, {4, 4}};
  for (const auto& [world, ep] : layouts) {
    SCOPED_TRACE("world " + std::to_string(world) + ", ep " + std::to_string(ep));
    const bool split = ep > 1, replicated_experts = split && world > ep;
    std::vector<OptimizerShards> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(optimizer_shards_for(w, world, r, ep));
    std::vector<std::pair<std::string, int64_t>> sizes;
    for (const auto& [name, t] : params) sizes.emplace_back(name, t->numel());
    std::vector<int64_t> load(static_cast<size_t>(world), 0);
    int64_t total = 0, largest = 0, expert_stacks = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].first;
      const int64_t n = params[i].second->numel();
      const bool expert = w.param_table().is_expert_stack(name);
      int updaters = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(ranks[r].owner(name), ranks[r].owner(i)) << name;
        EXPECT_EQ(ranks[r].over_replicas(i), expert && replicated_experts) << name;
        updaters += ranks[r].updates(i);
      }
      if (split && expert) {
        for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[r].world_owner(i), -1) << name;
        if (!replicated_experts) {
          EXPECT_EQ(ranks[0].owner(i), -1) << name << ": expert parallelism holds it";
          EXPECT_EQ(updaters, world) << name;
          continue;
        }
        // One updater per replica group (ep groups, one per slice of the stack, of world / ep ranks each).
        EXPECT_EQ(updaters, ep) << name;
        const int position = ranks[0].replica_index(ranks[0].owner(i));
        for (int r = 0; r < world; ++r) {
          const std::vector<int> replicas = expert_replica_ranks(world, r, ep);
          EXPECT_EQ(ranks[r].replicas(), replicas);
          ASSERT_GE(ranks[r].owner(i), 0) << name;
          EXPECT_EQ(ranks[r].owner(i), replicas[static_cast<size_t>(position)])
              << name << ": rank " << r << "'s replica group uses the same map";
          EXPECT_EQ(ranks[r].updates(i), ranks[r].owner(i) == r);
        }
        ++expert_stacks;
        continue;
      }
      ASSERT_GE(ranks[0].owner(i), 0) << name;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(ranks[r].owner(i), ranks[0].owner(i)) << name << ": every rank computes the same map";
        EXPECT_EQ(ranks[r].world_owner(i), ranks[0].owner(i)) << name;
      }
      // The replicated parameters' owners are those of the map without expert replicas.
      const OptimizerShards plain(sizes, world, 0, [&](const std::string& m) { return !(split && w.param_table().is_expert_stack(m)); });
      EXPECT_EQ(plain.owner(i), ranks[0].owner(i)) << name;
      EXPECT_EQ(updaters, 1) << name;
      load[static_cast<size_t>(ranks[0].owner(i))] += n;
      total += n;
      largest = std::max(largest, n);
    }
    if (replicated_experts) {
      EXPECT_EQ(expert_stacks, 2 * cfg.num_layers()) << "every layer is MoE in the preset";
    }
    // The largest-first bound: no rank holds more than the average plus one tensor; every rank holds some.
    for (int64_t l : load) {
      EXPECT_GT(l, 0);
      EXPECT_LE(l, total / world + largest);
    }
    for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[r].experts_sharded(), replicated_experts);
  }
}

// The expert stacks go by their per-expert size: a rank holding only its E/ep experts (the CPU engine's compact
// stacks) computes the map of one holding all E (the GPU engine's host copy, the trainer's shape-only copy);
// each replica shares the stacks largest first (two MoE layers of gate_up [2I·H] and down [H·I] per expert:
// the two gate_ups to different replicas, then each down to the less-loaded one).
TEST(OptimizerShards, ExpertStacksShardedOverTheirReplicasBySize) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["num_hidden_layers"] = 2;
  const DecoderSpec cfg = DecoderSpec::from_json(j, "qwen3-moe-test");
  const int64_t E = cfg.num_experts();
  const ModelWeights all = ModelWeights::absent_like_config(cfg, DType::BF16);
  const ModelWeights held = ModelWeights::absent_like_config(cfg, DType::BF16, Device::cpu(), E / 2);
  const auto params = all.named_parameters();
  for (int r = 0; r < 4; ++r) {
    const OptimizerShards a = optimizer_shards_for(all, 4, r, 2), b = optimizer_shards_for(held, 4, r, 2);
    for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(a.owner(i), b.owner(i)) << params[i].first;
    EXPECT_EQ(a.replicas(), (std::vector<int>{r % 2, r % 2 + 2}));
    EXPECT_EQ(a.replica_index(r % 2 + 2), 1);
    EXPECT_THROW(a.replica_index((r + 1) % 4), Error);
    // gate_up of layer 0 -> position 0, gate_up of layer 1 -> position 1, down of layer 0 -> position 0 (the
    // loads tie: the lower position), down of layer 1 -> position 1.
    const int p0 = r % 2, p1 = r % 2 + 2;
    EXPECT_EQ(a.owner("model.layers.0.mlp.experts.gate_up_proj"), p0);
    EXPECT_EQ(a.owner("model.layers.1.mlp.experts.gate_up_proj"), p1);
    EXPECT_EQ(a.owner("model.layers.0.mlp.experts.down_proj"), p0);
    EXPECT_EQ(a.owner("model.layers.1.mlp.experts.down_proj"), p1);
    EXPECT_EQ(a.world_owner("model.layers.0.mlp.experts.down_proj"), -1);
    EXPECT_TRUE(a.over_replicas("model.layers.1.mlp.experts.down_proj"));
    EXPECT_FALSE(a.over_replicas("model.layers.1.mlp.gate.weight"));
  }
  // Without sharding nothing is owned; the replica ranks of a job are its ep-strided ranks.
  EXPECT_FALSE(optimizer_shards_for(all, 1, 0, 2).active());
  EXPECT_EQ(expert_replica_ranks(6, 4, 2), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(expert_replica_ranks(8, 5, 4), (std::vector<int>{1, 5}));
  EXPECT_EQ(expert_replica_ranks(4, 3, 1), (std::vector<int>{3}));
}

TEST(OptimizerShards, NamesOfStateTensors) {
  EXPECT_EQ(optimizer_state_param("model.norm.weight.exp_avg"), "model.norm.weight");
  EXPECT_EQ(optimizer_state_param("model.norm.weight.exp_avg_sq"), "model.norm.weight");
  EXPECT_EQ(optimizer_state_param("model.layers.0.mlp.experts.down_proj.master"), "model.layers.0.mlp.experts.down_proj");
  EXPECT_EQ(optimizer_state_param("model.norm.weight"), "");
  EXPECT_EQ(optimizer_state_param(".master"), "");
}

}  // namespace
}  // namespace mt
