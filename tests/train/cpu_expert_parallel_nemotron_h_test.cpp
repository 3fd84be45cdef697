// Nemotron-H under the CPU engine's expert parallelism (layers/expert_parallel.h), two ranks that are threads over
// loopback, on the hybrid_all_kinds fixture (fp32; layers M E M * E -, each MoE layer 8 ReLU² experts top-2 with the
// fp32 selection bias and a ReLU² shared expert): each rank holds its 4 experts' rows of both up/down stacks (the
// trainer's compact load), runs the replicated Mamba2 mixers, attention, routers, shared experts and MLP, and its
// experts' MLPs for both ranks' tokens.
//
// EP 2 against EP 1 (the whole model on each rank's batch): loss, logits and every gradient; the replicated ones
// against that batch's, each expert stack against the sum of both batches' rows of the rank's experts. Tolerances as
// cpu_expert_parallel_dsv3_test.cpp (fp32 sums over at most 64 terms taken in another order).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "layers/expert_parallel.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "models/hf_checkpoint_map.h"

#include "../distributed/thread_ranks.h"
#include "../models/hf_fixture_util.h"

namespace mt {
namespace {

using test::rel_norm_error;

const std::string kCkpt = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/nemotron_h/hybrid_all_kinds/ckpt";
constexpr int kWorld = 2;
constexpr double kLossRel = 1e-6;
constexpr double kLogitsRel = 1e-5;
constexpr double kGradRel = 1e-5;
constexpr double kTensorGradRel = 1e-4;

// One sequence of 24 tokens per rank (three Mamba chunks of 8; ids inside the vocabulary of 128).
Batch batch_of_rank(int rank) {
  const int64_t S = 24;
  Batch b;
  b.input_ids = Tensor::empty({1, S}, DType::I64);
  for (int64_t s = 0; s < S; ++s) b.input_ids.data_as<int64_t>()[s] = (5 + 37 * rank + 11 * s + s * s) % 128;
  b.labels = b.input_ids.clone();
  b.labels.data_as<int64_t>()[0] = -100;
  return b;
}

int64_t num_experts() { return DecoderSpec::from_file(kCkpt + "/config.json").num_experts(); }

CausalLM load_rank(int rank, int64_t ep, DType dtype) {
  LoadOptions lo;
  lo.dtype = dtype;
  if (ep > 1) {
    lo.expert_count = num_experts() / ep;
    lo.expert_first = rank % ep * lo.expert_count;
    lo.compact_experts = true;
  }
  return CausalLM::from_pretrained(kCkpt, lo);
}

using Named = std::vector<std::pair<std::string, Tensor>>;
Named cloned(ModelWeights& w) {
  Named r;
  for (auto& [name, t] : w.named_parameters()) r.emplace_back(name, t->clone());
  return r;
}

std::vector<float> rows_of_sum(const Tensor& a, const Tensor& b, int64_t first, int64_t n) {
  const std::vector<float> x = a.rows(first, first + n).to_floats(), y = b.rows(first, first + n).to_floats();
  std::vector<float> s(x.size());
  for (size_t i = 0; i < x.size(); ++i) s[i] = static_cast<float>(double(x[i]) + y[i]);
  return s;
}

TEST(CpuExpertParallelNemotronH, Ep2MatchesEp1LossLogitsAndEveryGradient) {
  const int64_t E = num_experts(), per_rank = E / kWorld;
  struct RankOut {
    ForwardResult fwd, fb;
    Named grads;
  };
  std::vector<RankOut> out(kWorld);
  const int port = test::free_port();
  const auto err = test::run_ranks(kWorld, [&](int r) {
    auto comm = tcp_communicator_create(test::env_of(r, kWorld, port), std::chrono::milliseconds(20000));
    CausalLM lm = load_rank(r, kWorld, DType::F32);
    const ExpertParallel ep = expert_parallel_for(comm.get(), kWorld, E);
    ModelOptions mo;
    mo.expert_parallel = &ep;
    DecoderModel net(lm.config, lm.weights, mo);
    const Batch b = batch_of_rank(r);
    out[r].fwd = net.forward(b, true);
    ModelWeights g = ModelWeights::zeros_like_config(lm.config, DType::F32, per_rank);
    out[r].fb = net.forward_backward(b, g);
    out[r].grads = cloned(g);
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(err[r], "") << "rank " << r;

  CausalLM whole = load_rank(0, 1, DType::F32);
  DecoderModel net(whole.config, whole.weights);
  std::vector<ForwardResult> fwd(kWorld);
  std::vector<Named> grads(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    fwd[r] = net.forward(batch_of_rank(r), true);
    ModelWeights g = ModelWeights::zeros_like_config(whole.config, DType::F32);
    net.forward_backward(batch_of_rank(r), g);
    grads[r] = cloned(g);
  }
  const ParamTable& table = whole.weights.param_table();
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    for (const ForwardResult* f : {&out[r].fwd, &out[r].fb}) {
      EXPECT_NEAR(f->loss, fwd[r].loss, kLossRel * fwd[r].loss);
      EXPECT_EQ(f->tokens, fwd[r].tokens);
    }
    EXPECT_LE(rel_norm_error(out[r].fwd.logits.to_floats(), fwd[r].logits.to_floats()), kLogitsRel);
    ASSERT_EQ(out[r].grads.size(), grads[r].size());
    std::vector<float> all_got, all_want;
    int stacks = 0;
    for (size_t i = 0; i < grads[r].size(); ++i) {
      const auto& [name, g] = out[r].grads[i];
      SCOPED_TRACE(name);
      ASSERT_EQ(name, grads[r][i].first);
      const bool stack = table.is_expert_stack(name);
      stacks += stack;
      const std::vector<float> want = stack ? rows_of_sum(grads[0][i].second, grads[1][i].second, r * per_rank,
                                                          per_rank)
                                            : grads[r][i].second.to_floats();
      if (stack) {
        EXPECT_EQ(g.dim(0), per_rank);
      }
      const std::vector<float> got = g.to_floats();
      EXPECT_LE(rel_norm_error(got, want), kTensorGradRel);
      all_got.insert(all_got.end(), got.begin(), got.end());
      all_want.insert(all_want.end(), want.begin(), want.end());
    }
    EXPECT_EQ(stacks, 4);  // up_proj and down_proj of layers 1 and 4
    EXPECT_LE(rel_norm_error(all_got, all_want), kGradRel);
  }
}

}  // namespace
}  // namespace mt
