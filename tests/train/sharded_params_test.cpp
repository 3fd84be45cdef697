// ZeRO-3's parameter residency (train/sharded_params.h) on two to four ranks that are threads over loopback:
// after shard() a rank holds exactly the tensors it owns; a fetched group is present on every rank with the
// owner's bytes; release drops it again, after the forward only when the policy reshards; the model-facing
// group numbering covers every parameter once (twice for a tied embedding).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "models/presets.h"
#include "models/spec/decoder_spec.h"
#include "models/model_weights.h"
#include "train/optimizer_shards.h"
#include "train/sharded_params.h"

#include "../distributed/thread_ranks.h"

namespace mt {
namespace {

DecoderSpec test_config(bool tied) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["tie_word_embeddings"] = tied;
  return DecoderSpec::from_json(j, "qwen3-moe-test");
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(ShardedParams, GroupsFollowTheForwardOrder) {
  EXPECT_EQ(ShardedParams::group_of("model.embed_tokens.weight", 4), ParamResidency::kEmbedding);
  EXPECT_EQ(ShardedParams::group_of("model.layers.0.self_attn.q_proj.weight", 4), 0);
  EXPECT_EQ(ShardedParams::group_of("model.layers.3.mlp.gate.weight", 4), 3);
  EXPECT_EQ(ShardedParams::group_of("model.layers.12.input_layernorm.weight", 16), 12);
  EXPECT_EQ(ShardedParams::group_of("model.norm.weight", 4), ParamResidency::head(4));
  EXPECT_EQ(ShardedParams::group_of("lm_head.weight", 4), 4);
}

// Each rank: the model's weights (the same seed everywhere), then the residency protocol step by step.
void run_protocol(int world, bool tied, bool reshard, int64_t ep) {
  const DecoderSpec cfg = test_config(tied);
  const int port = test::free_port();
  const auto err = test::run_ranks(world, [&](int r) {
    auto comm = tcp_communicator_create(test::env_of(r, world, port), std::chrono::milliseconds(20000));
    const ModelWeights original = ModelWeights::random_init(cfg, DType::F32, 11);
    ModelWeights w = ModelWeights::random_init(cfg, DType::F32, 11);
    const OptimizerShards shards = optimizer_shards_for(w, world, r, ep);
    ShardedParams sp(w, cfg, shards, *comm, reshard);
    sp.shard();
    const auto params = w.named_parameters();
    const auto want = original.named_parameters();
    const int64_t L = cfg.num_layers();
    // Present: the owned tensors (an expert stack sharded over its replicas: on its owner among them) and those
    // no rank owns (the expert-parallel stacks of a single copy); the others absent.
    auto expect_held = [&](int64_t fetched) {
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& name = params[i].first;
        const Tensor& t = *params[i].second;
        const int64_t g = ShardedParams::group_of(name, L);
        const bool in_fetched = fetched != -2 && (g == fetched || (tied && g == ParamResidency::kEmbedding &&
                                                                   fetched == ParamResidency::head(L)));
        const bool held = shards.owner(i) < 0 || shards.owner(i) == r || in_fetched;
        ASSERT_EQ(t.present(), held) << "rank " << r << " " << name;
        ASSERT_EQ(t.shape(), want[i].second->shape()) << name;
        if (held) {
          ASSERT_TRUE(same_bytes(t, *want[i].second)) << "rank " << r << " " << name;
        }
      }
    };
    expect_held(-2);
    for (int64_t g = ParamResidency::kEmbedding; g <= ParamResidency::head(L); ++g) {
      SCOPED_TRACE("group " + std::to_string(g));
      sp.fetch(g);
      expect_held(g);
      sp.fetch(g);  // present already: no collective (a mismatch between the ranks would hang or fail)
      sp.release(g, /*backward_follows=*/true);
      expect_held(reshard ? -2 : g);
      sp.release(g, false);
      expect_held(-2);
    }
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
}

TEST(ShardedParams, EachRankHoldsItsOwnAndFetchesTheRestPerGroup) {
  for (const bool reshard : {true, false}) {
    SCOPED_TRACE(reshard ? "reshard after forward" : "kept until the backward");
    run_protocol(2, false, reshard, 1);
  }
  run_protocol(3, false, true, 1);
  run_protocol(2, false, true, /*ep=*/2);
  run_protocol(4, false, true, /*ep=*/2);  // the expert stacks sharded over their two replicas, weights and state
}

TEST(ShardedParams, TiedEmbeddingIsFetchedForTheHeadToo) { run_protocol(2, true, true, 1); }

TEST(ShardedParams, AbsentTensorKeepsItsShapeButNotItsBytes) {
  const Tensor t = Tensor::absent({3, 4}, DType::BF16);
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(t.present());
  EXPECT_EQ(t.shape(), (Shape{3, 4}));
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_THROW(t.data(), Error);
  EXPECT_THROW(t.rows(1, 2).data(), Error);
  EXPECT_TRUE(Tensor::empty({3, 4}, DType::BF16).present());
}

}  // namespace
}  // namespace mt
