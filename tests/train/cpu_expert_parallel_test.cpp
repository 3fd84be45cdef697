// The CPU engine under expert parallelism (parallel.ep), two ranks that are threads over loopback, loading the
// moe_gqa_aux fixture (fp32, 8 experts, two MoE layers) as the trainer does: each rank's model holds only its
// own experts (stacks of E/ep rows, the checkpoint's rows of those experts), and the tensor bytes the two ranks
// hold once their engines are built and have taken a step are exactly those of the ep 1 run less, per rank,
// the other ranks' experts' weights, gradients and both AdamW moments. The step itself (loss, gradient norm)
// agrees with the ep 1 run within fp32 summation order.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/memory.h"
#include "distributed/communicator.h"
#include "models/causal_lm.h"
#include "train/train_engine.h"

#include "../distributed/thread_ranks.h"
#include "fixture_tensors.h"

namespace mt {
namespace {

const std::string kCkpt = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/moe_gqa_aux/ckpt";

// A different row of tokens per rank (ids inside the fixture's vocabulary of 128).
Batch batch_of_rank(int rank) {
  const int64_t S = 16;
  Batch b;
  b.input_ids = Tensor::empty({1, S}, DType::I64);
  for (int64_t s = 0; s < S; ++s) b.input_ids.data_as<int64_t>()[s] = (7 + 31 * rank + 13 * s) % 128;
  b.labels = b.input_ids.clone();
  return b;
}

// An fp32 CPU recipe with experts split over groups of `ep` ranks.
Recipe cpu_ep_recipe(int64_t ep, bool shard_optimizer) {
  Recipe recipe;
  recipe.model.dtype = "float32";
  recipe.train.device = "cpu";
  recipe.optimizer.lr = 1e-3;
  recipe.parallel.ep = ep;
  recipe.parallel.shard_optimizer = shard_optimizer;
  return recipe;
}

struct EpRun {
  int64_t held_bytes = 0;  // tensor bytes both ranks hold after one step (models, gradients, optimizer state)
  std::vector<EngineStep> steps = std::vector<EngineStep>(2);
  std::vector<int64_t> expert_rows = std::vector<int64_t>(2, 0);
};

EpRun run_two_ranks(int64_t ep) {
  const int world = 2, port = test::free_port();
  EpRun run;
  const int64_t before = memory_stats(Device::cpu()).current_bytes;
  const auto err = test::run_ranks(world, [&](int r) {
    auto comm = tcp_communicator_create(test::env_of(r, world, port), std::chrono::milliseconds(20000));
    const Recipe recipe = cpu_ep_recipe(ep, false);  // unsharded: every rank keeps the state of what it holds
    LoadOptions lo;
    lo.dtype = DType::F32;
    const CausalLM whole = CausalLM::from_pretrained(kCkpt, lo);
    const int64_t E = whole.config.num_experts();
    if (ep > 1) {  // as the trainer loads an expert-parallel CPU rank
      lo.expert_count = E / ep;
      lo.expert_first = r % ep * lo.expert_count;
      lo.compact_experts = true;
    }
    CausalLM lm = CausalLM::from_pretrained(kCkpt, lo);
    auto engine = cpu_engine_create(lm, recipe, comm.get());
    const Batch b = batch_of_rank(r);
    run.steps[r] = engine->step({b}, 30.0, 1e-3, 1.0);
    // The model's stacks: this rank's experts, which started as the checkpoint's rows of them.
    for (size_t l = 0; l < lm.weights.layers.size(); ++l) {
      const Tensor& gu = lm.weights.layers[l].experts_gate_up;
      if (!gu.defined()) continue;
      run.expert_rows[r] = gu.dim(0);
      EXPECT_EQ(lm.weights.layers[l].experts_down.dim(0), gu.dim(0));
      if (ep > 1) {
        EXPECT_EQ(lm.expert_first, lo.expert_first);
      }
      // The router is replicated and trained alike on every rank; the experts moved from the checkpoint.
      const int64_t first = ep > 1 ? lo.expert_first : 0;
      const Tensor start = whole.weights.layers[l].experts_gate_up.rows(first, first + gu.dim(0));
      EXPECT_FALSE(test::tensor_bytes_equal(start, gu)) << "layer " << l << ": the experts did not train";
      EXPECT_EQ(start.shape(), gu.shape());
    }
    comm->barrier("barrier(everything held)");
    if (r == 0) run.held_bytes = memory_stats(Device::cpu()).current_bytes - before;
    comm->barrier("barrier(measured)");
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(err[r], "") << "ep " << ep << " rank " << r;
  return run;
}

TEST(CpuExpertParallel, EachRankHoldsOnlyItsExperts) {
  const EpRun one = run_two_ranks(1), split = run_two_ranks(2);
  LoadOptions lo;
  lo.dtype = DType::F32;
  const DecoderSpec cfg = CausalLM::from_pretrained(kCkpt, lo).config;
  const int64_t E = cfg.num_experts(), H = cfg.hidden_size, I = cfg.only_moe().expert.intermediate_size;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < cfg.num_layers(); ++l) moe_layers += cfg.is_moe_layer(l);
  ASSERT_EQ(moe_layers, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(one.expert_rows[r], E);
    EXPECT_EQ(split.expert_rows[r], E / 2);
  }
  // Per rank and MoE layer, E/2 experts of 3·I·H fp32 values fewer, each with its gradient, exp_avg and
  // exp_avg_sq (fp32 weights: no master copy).
  const int64_t per_rank = moe_layers * (E / 2) * 3 * I * H * 4 * static_cast<int64_t>(sizeof(float));
  EXPECT_EQ(one.held_bytes - split.held_bytes, 2 * per_rank)
      << "ep 1 holds " << one.held_bytes << " bytes, ep 2 " << split.held_bytes;
  // The same step: the losses summed over the ranks, the norm over every expert of the model.
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(split.steps[r].finite);
    EXPECT_NEAR(split.steps[r].loss, one.steps[r].loss, 1e-6 * std::fabs(one.steps[r].loss));
    EXPECT_NEAR(split.steps[r].grad_norm, one.steps[r].grad_norm, 1e-6 * one.steps[r].grad_norm);
    EXPECT_EQ(split.steps[r].grad_norm, split.steps[0].grad_norm) << "the ranks disagree on the norm";
  }
}

// Four ranks with EP 2 (ranks {0, 2} hold experts 0-3, {1, 3} experts 4-7), ZeRO-1 on or off, three steps.
struct ReplicaRun {
  std::vector<std::vector<EngineStep>> steps = std::vector<std::vector<EngineStep>>(4);
  std::vector<int64_t> state_bytes = std::vector<int64_t>(4, 0);  // each rank's optimizer state
  std::vector<std::vector<Tensor>> weights = std::vector<std::vector<Tensor>>(4);  // after the last step
  std::vector<OptimizerShards> shards = std::vector<OptimizerShards>(4);
  std::vector<std::vector<std::pair<std::string, int64_t>>> params =
      std::vector<std::vector<std::pair<std::string, int64_t>>>(4);
  std::shared_ptr<const ParamTable> table;  // the model's
};

// pad: the model's padding index (the fixture's config has none); shard_params: ZeRO-3 on top.
ReplicaRun run_four_ranks_ep2(bool shard, std::optional<int64_t> pad = std::nullopt, bool shard_params = false) {
  const int world = 4, port = test::free_port();
  ReplicaRun run;
  const auto err = test::run_ranks(world, [&](int r) {
    auto comm = tcp_communicator_create(test::env_of(r, world, port), std::chrono::milliseconds(20000));
    Recipe recipe = cpu_ep_recipe(2, shard);
    recipe.parallel.shard_parameters = shard_params;
    LoadOptions lo;
    lo.dtype = DType::F32;
    lo.expert_count = 4;
    lo.expert_first = r % 2 * 4;
    lo.compact_experts = true;
    CausalLM lm = CausalLM::from_pretrained(kCkpt, lo);
    lm.config.padding_idx = pad;
    auto engine = cpu_engine_create(lm, recipe, comm.get());
    for (int s = 0; s < 3; ++s) run.steps[r].push_back(engine->step({batch_of_rank(r + 4 * s)}, 60.0, 1e-3, 1.0));
    run.state_bytes[r] = engine->optimizer_state_bytes();
    run.shards[r] = engine->optimizer_shards();
    if (r == 0) run.table = lm.weights.table;
    for (auto& [name, t] : lm.weights.named_parameters()) {
      run.weights[r].push_back(t->present() ? t->clone() : Tensor());  // ZeRO-3: only the owner holds it
      run.params[r].emplace_back(name, static_cast<int64_t>(t->nbytes()));
    }
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(err[r], "") << "shard " << shard << " rank " << r;
  return run;
}

// ZeRO-1 of the expert stacks over their replicas: each stack's AdamW state on one of the two ranks holding its
// experts (the same position in both replica groups), its gradient reduced onto that owner, its norm taken from
// the owners' group, the update broadcast to the other replica. The step is the unsharded one bit for bit (the
// reduce sums in the all-reduce's order; the norm's zeros add nothing), so losses, norms and every rank's weights
// after three steps are equal; each rank's optimizer state shrinks by exactly the moments (fp32 weights: no
// master) of the tensors it does not own: the expert stacks the other replica owns and the replicated tensors
// of the three other ranks.
TEST(CpuExpertParallel, ExpertStateShardedOverReplicasTrainsBitwiseLikeUnsharded) {
  const ReplicaRun whole = run_four_ranks_ep2(false), sharded = run_four_ranks_ep2(true);
  int64_t owned_stacks = 0;
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(sharded.steps[r].size(), 3u);
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_TRUE(sharded.steps[r][s].finite);
      EXPECT_EQ(sharded.steps[r][s].loss, whole.steps[r][s].loss) << "step " << s + 1;
      EXPECT_EQ(sharded.steps[r][s].grad_norm, whole.steps[r][s].grad_norm) << "step " << s + 1;
      EXPECT_GT(sharded.steps[r][s].grad_norm, 0.0);
    }
    ASSERT_EQ(sharded.weights[r].size(), whole.weights[r].size());
    for (size_t i = 0; i < whole.weights[r].size(); ++i)
      EXPECT_TRUE(test::tensor_bytes_equal(sharded.weights[r][i], whole.weights[r][i])) << sharded.params[r][i].first;
    // The replicas agree on their experts' weights (the owner's update reached the other).
    for (size_t i = 0; i < sharded.weights[r].size(); ++i)
      EXPECT_TRUE(test::tensor_bytes_equal(sharded.weights[r][i], sharded.weights[(r + 2) % 4][i]));
    const OptimizerShards& sh = sharded.shards[r];
    ASSERT_TRUE(sh.experts_sharded());
    EXPECT_EQ(sh.replicas(), (std::vector<int>{r % 2, r % 2 + 2}));
    EXPECT_TRUE(whole.shards[r].replicas().empty());
    int64_t experts_not_owned = 0, replicated_not_owned = 0;  // bytes of exp_avg + exp_avg_sq of others' tensors
    for (size_t i = 0; i < sharded.params[r].size(); ++i) {
      const int64_t state = 2 * sharded.params[r][i].second;
      if (sharded.table->is_expert_stack(sharded.params[r][i].first)) {
        ASSERT_TRUE(sh.over_replicas(i));
        if (sh.owner(i) == r)
          ++owned_stacks;
        else
          experts_not_owned += state;
      } else if (sh.owner(i) != r) {
        replicated_not_owned += state;
      }
    }
    EXPECT_GT(experts_not_owned, 0);
    EXPECT_EQ(whole.state_bytes[r] - sharded.state_bytes[r], experts_not_owned + replicated_not_owned)
        << "unsharded " << whole.state_bytes[r] << " bytes, sharded " << sharded.state_bytes[r];
  }
  EXPECT_EQ(owned_stacks, 2 * 2 * 2) << "each of the 2 MoE layers' 2 stacks owned once per replica group";
}

// Transformers' nn.Embedding(padding_idx): the pad row gets no gradient, so with no weight decay AdamW leaves it
// as loaded (zero moments: update 0 / (0 + eps) = 0). Row 7 is in rank 0's tokens; under EP 2 with the optimizer
// unsharded, ZeRO-1 and ZeRO-3 the row stays bit for bit the checkpoint's on every rank holding the embedding, the
// three runs end with the same weights, and without a padding index the same row trains.
TEST(CpuExpertParallel, PadRowGetsNoGradientUnderExpertParallelAndZero) {
  const int64_t pad = 7;
  ASSERT_EQ(batch_of_rank(0).input_ids.data_as<int64_t>()[0], pad);
  LoadOptions lo;
  lo.dtype = DType::F32;
  const CausalLM start = CausalLM::from_pretrained(kCkpt, lo);
  const Tensor start_row = start.weights.embed.rows(pad, pad + 1);
  const ReplicaRun plain = run_four_ranks_ep2(true), unsharded = run_four_ranks_ep2(false, pad),
                   zero1 = run_four_ranks_ep2(true, pad), zero3 = run_four_ranks_ep2(true, pad, true);
  const size_t embed = 0;  // model.embed_tokens.weight comes first in the table
  ASSERT_EQ(unsharded.params[0][embed].first, "model.embed_tokens.weight");
  int64_t holders = 0;
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Tensor& trained = plain.weights[r][embed];
    ASSERT_TRUE(trained.defined());
    EXPECT_FALSE(test::tensor_bytes_equal(trained.rows(pad, pad + 1), start_row)) << "without a pad index it trains";
    for (const ReplicaRun* run : {&unsharded, &zero1, &zero3}) {
      const Tensor& w = run->weights[r][embed];
      if (!w.defined()) continue;  // ZeRO-3: another rank owns it
      ++holders;
      EXPECT_TRUE(test::tensor_bytes_equal(w.rows(pad, pad + 1), start_row));
      EXPECT_FALSE(test::tensor_bytes_equal(w, start.weights.embed)) << "the other rows train";
      ASSERT_TRUE(unsharded.weights[r][embed].defined());
      EXPECT_TRUE(test::tensor_bytes_equal(w, unsharded.weights[r][embed]));
    }
  }
  EXPECT_EQ(holders, 4 + 4 + 1) << "every rank holds the embedding but under ZeRO-3, where its owner does";
}

}  // namespace
}  // namespace mt
