// DeepSeek-V3 under the CPU engine's expert parallelism (layers/expert_parallel.h), two ranks that are threads over
// loopback, on the mla_yarn_dense1 fixture (fp32; layer 0 MLA + dense MLP, layer 1 MLA + 8 experts in 4 groups, top-2,
// the fp32 selection bias, a shared expert): each rank holds its 4 experts' rows (the trainer's compact load), runs
// the replicated MLA, router and shared expert, and its experts' MLPs for both ranks' tokens.
//
// EP 2 against EP 1 (the whole model on each rank's batch): loss, logits and every gradient; the replicated ones
// against that batch's, each expert stack against the sum of both batches' rows of the rank's experts. Then two AdamW
// steps of the engine (EP 2 against data-parallel EP 1 on the same two ranks; the selection bias untouched), and the
// model saved by the EP 2 ranks byte for byte the one-process save. The tolerances and their derivation are
// cpu_expert_parallel_gpt_oss_test.cpp's (fp32 sums over at most 64 terms taken in another order): nothing here
// adds a longer sum.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "layers/expert_parallel.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "models/hf_checkpoint_map.h"
#include "train/shared_save.h"
#include "train/train_engine.h"

#include "../distributed/thread_ranks.h"
#include "../io/io_test_util.h"
#include "../models/hf_fixture_util.h"
#include "expert_parallel_parity.h"
#include "fixture_tensors.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

const std::string kCkpt = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/deepseek_v3/mla_yarn_dense1/ckpt";
constexpr int kWorld = test::kEpWorld;
constexpr double kLossRel = test::kEpLossRel;
constexpr double kGradRel = test::kEpGradRel;
constexpr double kLr = 1e-3;

// Two documents packed into a row of 24 tokens per rank (ids inside the vocabulary of 128), first labels masked.
Batch batch_of_rank(int rank) {
  const int64_t S = 24;
  Batch b;
  b.input_ids = Tensor::empty({1, S}, DType::I64);
  b.position_ids = Tensor::empty({1, S}, DType::I64);
  for (int64_t s = 0; s < S; ++s) {
    b.input_ids.data_as<int64_t>()[s] = (5 + 37 * rank + 11 * s + s * s) % 128;
    b.position_ids.data_as<int64_t>()[s] = s < 10 ? s : s - 10;
  }
  b.labels = b.input_ids.clone();
  b.labels.data_as<int64_t>()[0] = -100;
  b.labels.data_as<int64_t>()[10] = -100;
  return b;
}

int64_t num_experts() { return test::fixture_num_experts(kCkpt); }
CausalLM load_rank(int rank, int64_t ep, DType dtype) { return test::load_expert_slice(kCkpt, rank, ep, dtype); }
using Named = test::NamedTensors;
Named cloned(ModelWeights& w) { return test::cloned_parameters(w); }

TEST(CpuExpertParallelDeepseekV3, Ep2MatchesEp1LossLogitsAndEveryGradient) {
  test::expect_ep2_matches_ep1(kCkpt, batch_of_rank, 2);  // gate_up_proj and down_proj of layer 1
}

Recipe cpu_ep_recipe(int64_t ep) {
  Recipe recipe;
  recipe.model.dtype = "float32";
  recipe.train.device = "cpu";
  recipe.optimizer.lr = kLr;
  recipe.optimizer.weight_decay = 0.01;
  recipe.parallel.ep = ep;
  recipe.parallel.shard_optimizer = false;
  return recipe;
}

// Two AdamW steps per layout; the EP 2 ranks then save the model together (train/shared_save.h). The losses and
// gradient norms follow EP 1's, the selection bias stays as loaded on every rank, and the shared save is byte for
// byte the one-process save of the same weights.
TEST(CpuExpertParallelDeepseekV3, EngineStepsFollowEp1AndTheSharedSaveIsTheWholeSave) {
  io_test::ScratchDir dir;
  const int64_t per_rank = num_experts() / kWorld;
  std::vector<std::vector<EngineStep>> steps1(kWorld), steps2(kWorld);
  std::vector<Named> weights2(kWorld);
  const Tensor bias0 = load_rank(0, 1, DType::F32).weights.layers[1].router_score_bias.clone();
  for (int64_t ep : {1, 2}) {
    const int port = test::free_port();
    const auto err = test::run_ranks(kWorld, [&](int r) {
      auto comm = tcp_communicator_create(test::env_of(r, kWorld, port), std::chrono::milliseconds(20000));
      CausalLM lm = load_rank(r, ep, DType::F32);
      auto engine = cpu_engine_create(lm, cpu_ep_recipe(ep), comm.get());
      for (int s = 0; s < 2; ++s)
        (ep == 1 ? steps1 : steps2)[r].push_back(engine->step({batch_of_rank(r + kWorld * s)}, 40.0, kLr, 1.0));
      engine->weights_to_host();
      EXPECT_TRUE(test::tensor_bytes_equal(lm.weights.layers[1].router_score_bias, bias0));
      if (ep == 1) return;
      weights2[r] = cloned(lm.weights);
      const SaveShare share = save_share_for(comm.get(), r, kWorld, ep, lm.weights.table,
                                             hf_name_map_of(lm.config, *lm.weights.table, lm.dtype));
      shared_dir_save(
          share, dir.file("ep2"), [&](const std::string& tmp) { lm.write_pretrained_layout(tmp); },
          [&](const std::string& tmp) {
            lm.write_pretrained_rows(tmp,
                                     [&](const std::string& n, const Tensor& t) { return share.model_rows(n, t); });
          });
    });
    for (int r = 0; r < kWorld; ++r) ASSERT_EQ(err[r], "") << "ep " << ep << " rank " << r;
  }
  for (int r = 0; r < kWorld; ++r)
    for (size_t s = 0; s < 2; ++s) {
      SCOPED_TRACE("rank " + std::to_string(r) + " step " + std::to_string(s + 1));
      EXPECT_NEAR(steps2[r][s].loss, steps1[r][s].loss, kLossRel * steps1[r][s].loss);
      EXPECT_NEAR(steps2[r][s].grad_norm, steps1[r][s].grad_norm, kGradRel * steps1[r][s].grad_norm);
      EXPECT_EQ(steps2[r][s].loss, steps2[0][s].loss);
    }
  // The one-process save of the EP 2 run's weights.
  CausalLM whole = load_rank(0, 1, DType::F32);
  const ParamTable& table = whole.weights.param_table();
  auto params = whole.weights.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor& t = *params[i].second;
    if (!table.is_expert_stack(params[i].first)) {
      t.copy_from(weights2[0][i].second);
      continue;
    }
    for (int r = 0; r < kWorld; ++r) t.rows(r * per_rank, (r + 1) * per_rank).copy_from(weights2[r][i].second);
  }
  whole.save_pretrained(dir.file("ep1"));
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(dir.file("ep1"))) {
    SCOPED_TRACE(f.path().filename().string());
    const fs::path other = fs::path(dir.file("ep2")) / f.path().filename();
    ASSERT_TRUE(fs::exists(other));
    EXPECT_EQ(io_test::read_bytes(f.path().string()), io_test::read_bytes(other.string()));
    ++files;
  }
  EXPECT_GE(files, 3u);
}

}  // namespace
}  // namespace mt
