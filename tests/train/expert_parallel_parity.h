// EP 2 against EP 1 on a fixture checkpoint, for the CPU engine's expert parallelism (layers/expert_parallel.h): two
// ranks that are threads over loopback, each loading its experts' rows (the trainer's compact load). Shared by the
// per-family tests (cpu_expert_parallel_dsv3_test.cpp, cpu_expert_parallel_nemotron_h_test.cpp). Tolerances: fp32
// sums over at most 64 terms taken in another order (the derivation of cpu_expert_parallel_gpt_oss_test.cpp).
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/communicator.h"
#include "layers/expert_parallel.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"

#include "../distributed/thread_ranks.h"
#include "../models/hf_fixture_util.h"

namespace mt::test {

constexpr int kEpWorld = 2;
constexpr double kEpLossRel = 1e-6;
constexpr double kEpLogitsRel = 1e-5;
constexpr double kEpGradRel = 1e-5;        // all gradients together
constexpr double kEpTensorGradRel = 1e-4;  // each gradient tensor

inline int64_t fixture_num_experts(const std::string& ckpt) {
  return DecoderSpec::from_file(ckpt + "/config.json").num_experts();
}

// The whole model (ep 1) or rank `rank`'s slice of the experts (ep > 1).
inline CausalLM load_expert_slice(const std::string& ckpt, int rank, int64_t ep, DType dtype) {
  LoadOptions lo;
  lo.dtype = dtype;
  if (ep > 1) {
    lo.expert_count = fixture_num_experts(ckpt) / ep;
    lo.expert_first = rank % ep * lo.expert_count;
    lo.compact_experts = true;
  }
  return CausalLM::from_pretrained(ckpt, lo);
}

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
inline NamedTensors cloned_parameters(ModelWeights& w) {
  NamedTensors r;
  for (auto& [name, t] : w.named_parameters()) r.emplace_back(name, t->clone());
  return r;
}

// Rows [first, first + n) of a + b, summed in double.
inline std::vector<float> rows_of_sum(const Tensor& a, const Tensor& b, int64_t first, int64_t n) {
  const std::vector<float> x = a.rows(first, first + n).to_floats(), y = b.rows(first, first + n).to_floats();
  std::vector<float> s(x.size());
  for (size_t i = 0; i < x.size(); ++i) s[i] = static_cast<float>(double(x[i]) + y[i]);
  return s;
}

// Loss, logits and every gradient of EP 2 against EP 1 (the whole model on each rank's batch): the replicated
// gradients against that batch's, each expert stack (`expert_stacks` of them) against the sum of both batches' rows
// of the rank's experts.
inline void expect_ep2_matches_ep1(const std::string& ckpt, const std::function<Batch(int)>& batch_of_rank,
                                   int expert_stacks) {
  const int64_t E = fixture_num_experts(ckpt), per_rank = E / kEpWorld;
  struct RankOut {
    ForwardResult fwd, fb;
    NamedTensors grads;
  };
  std::vector<RankOut> out(kEpWorld);
  const int port = free_port();
  const auto err = run_ranks(kEpWorld, [&](int r) {
    auto comm = tcp_communicator_create(env_of(r, kEpWorld, port), std::chrono::milliseconds(20000));
    CausalLM lm = load_expert_slice(ckpt, r, kEpWorld, DType::F32);
    const ExpertParallel ep = expert_parallel_for(comm.get(), kEpWorld, E);
    ModelOptions mo;
    mo.expert_parallel = &ep;
    DecoderModel net(lm.config, lm.weights, mo);
    const Batch b = batch_of_rank(r);
    out[r].fwd = net.forward(b, true);
    ModelWeights g = ModelWeights::zeros_like_config(lm.config, DType::F32, per_rank);
    out[r].fb = net.forward_backward(b, g);
    out[r].grads = cloned_parameters(g);
  });
  for (int r = 0; r < kEpWorld; ++r) ASSERT_EQ(err[r], "") << "rank " << r;

  CausalLM whole = load_expert_slice(ckpt, 0, 1, DType::F32);
  DecoderModel net(whole.config, whole.weights);
  std::vector<ForwardResult> fwd(kEpWorld);
  std::vector<NamedTensors> grads(kEpWorld);
  for (int r = 0; r < kEpWorld; ++r) {
    fwd[r] = net.forward(batch_of_rank(r), true);
    ModelWeights g = ModelWeights::zeros_like_config(whole.config, DType::F32);
    net.forward_backward(batch_of_rank(r), g);
    grads[r] = cloned_parameters(g);
  }
  const ParamTable& table = whole.weights.param_table();
  for (int r = 0; r < kEpWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    for (const ForwardResult* f : {&out[r].fwd, &out[r].fb}) {
      EXPECT_NEAR(f->loss, fwd[r].loss, kEpLossRel * fwd[r].loss);
      EXPECT_EQ(f->tokens, fwd[r].tokens);
    }
    EXPECT_LE(rel_norm_error(out[r].fwd.logits.to_floats(), fwd[r].logits.to_floats()), kEpLogitsRel);
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
      EXPECT_LE(rel_norm_error(got, want), kEpTensorGradRel);
      all_got.insert(all_got.end(), got.begin(), got.end());
      all_want.insert(all_want.end(), want.begin(), want.end());
    }
    EXPECT_EQ(stacks, expert_stacks);
    EXPECT_LE(rel_norm_error(all_got, all_want), kEpGradRel);
  }
}

}  // namespace mt::test
