// GPT-OSS under the CPU engine's expert parallelism (layers/expert_parallel.h), two ranks that are threads over
// loopback, on the yarn_window_aux fixture (fp32, 4 experts top-2, biased experts with the clamped SwiGLU, a biased
// top-k-then-softmax router, sinks, the aux loss on): each rank holds its experts' weight and bias rows only (the
// trainer's compact load), runs the replicated router, and its experts' MLPs for both ranks' tokens.
//
// EP 2 against EP 1 (the whole model on each rank's batch): loss, CE, aux loss, logits and every gradient —
// the replicated ones (sinks, attention and router biases included) against that batch's, each expert stack (the
// two bias stacks included) against the sum of both batches' rows of the rank's experts; then three AdamW steps of
// the engine (EP 2 against data-parallel EP 1 on the same two ranks); then the model saved from the EP 2 ranks (each
// writing its experts' rows of the fused gate_up_proj [E, H, 2I], its bias, down_proj and its bias) byte for byte the
// EP 1 save of the same weights.
//
// Tolerances. Nothing here is bitwise by construction across the two layouts: under EP 2 an expert's GEMMs run
// over the rows of both ranks at once (OpenBLAS picks kernels and blockings by the row count), and an expert weight
// or bias gradient sums the rows of both batches in one pass where EP 1 sums each batch and then adds the two. Each
// such value is an fp32 sum of n terms taken in another order: the two differ by at most 2·γ_n·Σ|terms| (γ_n ≈ n·u,
// u = 2^-24), with n ≤ 64 here (48 routed rows per rank and batch, K ≤ 2I = 64), i.e. ≤ 7.7e-6 of Σ|terms|, and
// normwise far less (roundings do not all go one way). Relative to the result that bound is scaled by the sum's
// condition number Σ|terms| / |Σ terms|: ~1 for logits and most gradients, large for a gradient that nearly cancels
// (the k_proj bias, which the softmax would cancel exactly but for the sinks; the router bias, whose top-k-softmax
// rows sum to zero). Hence: loss, CE and aux within 1e-6 relative (as the Qwen3-MoE EP test), logits within 1e-5
// relative L2, all gradients together within 1e-5 relative L2 and each tensor within 1e-4 (its own cancellation),
// the gradient norm within 1e-5. After AdamW steps the weights: m/√v is scale-free, so a gradient's relative change
// δ moves its update by about δ·lr, except where the gradient is within Adam's eps of zero: there the update moves
// by lr·|Δg|/eps, up to a whole lr. So at most 0.1% of the elements may differ by more than 1e-6 (0.1% of a step's
// lr: this carries the check) and none by more than lr. Measured over OpenBLAS's core types (Nehalem, Sandybridge,
// Haswell, SkylakeX, Cooperlake, Zen, Core2, Penryn, Dunnington, Prescott, Atom): loss ≤ 3e-8, logits ≤ 4.3e-7, all
// gradients ≤ 1.3e-6 (5e-6 on the SSE3 kernels of Prescott to Dunnington), one tensor ≤ 7.6e-6 (layer 0's router
// bias), the norm ≤ 3e-6; the weights after 3 steps ≤ 5.9e-6 apart, at most 4 of 33904 elements beyond 1e-6.
// Bitwise, because the arithmetic is the same by construction: the two EP 2 ranks' replicated weights after the
// steps (one all-reduced gradient, one optimizer), the losses and gradient norm they report, and the saved files.
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
#include "fixture_tensors.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using test::rel_norm_error;

const std::string kCkpt = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/gpt_oss/yarn_window_aux/ckpt";
constexpr int kWorld = 2;
// The bounds the header derives.
constexpr double kLossRel = 1e-6;        // loss, CE, aux loss: relative
constexpr double kLogitsRel = 1e-5;      // relative L2
constexpr double kGradRel = 1e-5;        // all gradients together, relative L2; and the gradient norm
constexpr double kTensorGradRel = 1e-4;  // one gradient tensor, relative L2
constexpr double kLr = 1e-3;
constexpr double kWeightBulk = 1e-3 * kLr;  // after the steps, all but 0.1% of the elements
constexpr double kWeightOutlier = kLr;      // after the steps, every element

// A different row of 24 tokens per rank (ids inside the fixture's vocabulary of 128), its first label masked.
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

// The trainer's load of an expert-parallel CPU rank: its experts' rows only (weights and biases).
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

// rows [first, first + n) of a + b, summed in double (the reference for an expert stack's gradient under EP).
std::vector<float> rows_of_sum(const Tensor& a, const Tensor& b, int64_t first, int64_t n) {
  const std::vector<float> x = a.rows(first, first + n).to_floats(), y = b.rows(first, first + n).to_floats();
  std::vector<float> s(x.size());
  for (size_t i = 0; i < x.size(); ++i) s[i] = static_cast<float>(double(x[i]) + y[i]);
  return s;
}

double norm_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

TEST(CpuExpertParallelGptOss, Ep2MatchesEp1LossLogitsAndEveryGradient) {
  const int64_t E = num_experts(), per_rank = E / kWorld;
  struct RankOut {
    ForwardResult fwd, fb;
    Named grads;
    std::vector<std::string> stacks;  // names of the expert stacks
  };
  std::vector<RankOut> out(kWorld);
  const int port = test::free_port();
  const auto err = test::run_ranks(kWorld, [&](int r) {
    auto comm = tcp_communicator_create(test::env_of(r, kWorld, port), std::chrono::milliseconds(20000));
    CausalLM lm = load_rank(r, kWorld, DType::F32);
    const ExpertParallel ep = expert_parallel_for(comm.get(), kWorld, E);
    ASSERT_EQ(ep.first_expert(), r * per_rank);
    ModelOptions mo;
    mo.expert_parallel = &ep;
    DecoderModel net(lm.config, lm.weights, mo);
    const Batch b = batch_of_rank(r);
    out[r].fwd = net.forward(b, true);
    ModelWeights g = ModelWeights::zeros_like_config(lm.config, DType::F32, per_rank);
    out[r].fb = net.forward_backward(b, g);
    out[r].grads = cloned(g);
    for (const auto& [name, t] : out[r].grads)
      if (lm.weights.param_table().is_expert_stack(name)) out[r].stacks.push_back(name);
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(err[r], "") << "rank " << r;

  // EP 1: the whole model on each rank's batch.
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

  // The stacks that must be split: gate_up, its bias, down, its bias per MoE layer.
  const int64_t layers = whole.config.num_layers();
  ASSERT_EQ(out[0].stacks.size(), static_cast<size_t>(4 * layers));
  double worst_tensor = 0;
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    for (const ForwardResult* f : {&out[r].fwd, &out[r].fb}) {
      EXPECT_NEAR(f->loss, fwd[r].loss, kLossRel * fwd[r].loss);
      EXPECT_NEAR(f->ce_loss, fwd[r].ce_loss, kLossRel * fwd[r].ce_loss);
      EXPECT_GT(fwd[r].aux_loss, 0.0);
      EXPECT_NEAR(f->aux_loss, fwd[r].aux_loss, kLossRel * fwd[r].aux_loss);
      EXPECT_EQ(f->tokens, fwd[r].tokens);
    }
    ASSERT_TRUE(out[r].fwd.logits.defined());
    EXPECT_LE(rel_norm_error(out[r].fwd.logits.to_floats(), fwd[r].logits.to_floats()), kLogitsRel);

    ASSERT_EQ(out[r].grads.size(), grads[r].size());
    std::vector<float> all_got, all_want;
    for (size_t i = 0; i < grads[r].size(); ++i) {
      const auto& [name, g] = out[r].grads[i];
      SCOPED_TRACE(name);
      ASSERT_EQ(name, grads[r][i].first);
      const bool stack = whole.weights.param_table().is_expert_stack(name);
      // An expert stack's gradient covers both ranks' tokens, of this rank's experts; the rest this rank's batch.
      const std::vector<float> want =
          stack ? rows_of_sum(grads[0][i].second, grads[1][i].second, r * per_rank, per_rank)
                : grads[r][i].second.to_floats();
      if (stack) {
        EXPECT_EQ(g.dim(0), per_rank);
      }
      ASSERT_EQ(g.numel(), static_cast<int64_t>(want.size()));
      EXPECT_GT(norm_of(want), 0.0) << "a gradient the test cannot tell apart from a missing one";
      const std::vector<float> got = g.to_floats();
      const double e = rel_norm_error(got, want);
      EXPECT_LE(e, kTensorGradRel);
      worst_tensor = std::max(worst_tensor, e);
      all_got.insert(all_got.end(), got.begin(), got.end());
      all_want.insert(all_want.end(), want.begin(), want.end());
    }
    const double all = rel_norm_error(all_got, all_want);
    EXPECT_LE(all, kGradRel);
    std::printf("rank %d: EP 2 vs EP 1 gradients, relative L2: all %.3g, worst tensor %.3g\n", r, all, worst_tensor);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The engine: three AdamW steps, then the model saved by every rank.

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

struct EngineRun {
  std::vector<std::vector<EngineStep>> steps = std::vector<std::vector<EngineStep>>(kWorld);
  std::vector<Named> weights = std::vector<Named>(kWorld);  // each rank's parameters after the steps
  std::vector<int64_t> first = std::vector<int64_t>(kWorld, 0);
};

// Two ranks, experts over `ep` of them, three steps of one batch per rank; with `save_dir`, the final model saved
// there as the trainer saves it (every rank its share, train/shared_save.h).
EngineRun run_engine(int64_t ep, const std::string& save_dir = {}) {
  EngineRun run;
  const int port = test::free_port();
  const auto err = test::run_ranks(kWorld, [&](int r) {
    auto comm = tcp_communicator_create(test::env_of(r, kWorld, port), std::chrono::milliseconds(20000));
    CausalLM lm = load_rank(r, ep, DType::F32);
    auto engine = cpu_engine_create(lm, cpu_ep_recipe(ep), comm.get());
    for (int s = 0; s < 3; ++s) run.steps[r].push_back(engine->step({batch_of_rank(r + kWorld * s)}, 40.0, kLr, 1.0));
    run.weights[r] = cloned(lm.weights);
    run.first[r] = lm.expert_first;
    if (save_dir.empty()) return;
    engine->weights_to_host();
    const SaveShare share = save_share_for(comm.get(), r, kWorld, ep, lm.weights.table,
                                           hf_name_map_of(lm.config, *lm.weights.table, lm.dtype));
    shared_dir_save(
        share, save_dir, [&](const std::string& tmp) { lm.write_pretrained_layout(tmp); },
        [&](const std::string& tmp) {
          lm.write_pretrained_rows(tmp, [&](const std::string& n, const Tensor& t) { return share.model_rows(n, t); });
        });
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(err[r], "") << "ep " << ep << " rank " << r;
  return run;
}

// Every file of directory `a` (the same names in `b`) byte for byte.
void expect_same_files(const fs::path& a, const fs::path& b) {
  ASSERT_TRUE(fs::is_directory(b)) << b << " was not saved";
  size_t files = 0, tensors_files = 0;
  for (const auto& f : fs::directory_iterator(a)) {
    EXPECT_TRUE(fs::exists(b / f.path().filename())) << f.path().filename();
    EXPECT_EQ(io_test::read_bytes(f.path().string()), io_test::read_bytes((b / f.path().filename()).string()))
        << f.path().filename();
    ++files;
    tensors_files += f.path().extension() == ".safetensors";
  }
  size_t b_files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(b)) ++b_files;
  EXPECT_EQ(files, b_files);
  EXPECT_GE(tensors_files, 1u);
}

TEST(CpuExpertParallelGptOss, ThreeAdamWStepsTrainLikeEp1AndTheSavedModelIsTheEp1Save) {
  io_test::ScratchDir dir;
  const EngineRun one = run_engine(1), split = run_engine(2, dir.file("ep2"));
  const int64_t E = num_experts(), per_rank = E / kWorld;
  CausalLM start = load_rank(0, 1, DType::F32);
  const ParamTable& table = start.weights.param_table();
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(split.steps[r].size(), 3u);
    for (size_t s = 0; s < 3; ++s) {
      const EngineStep &a = one.steps[r][s], &b = split.steps[r][s];
      EXPECT_TRUE(b.finite);
      EXPECT_NEAR(b.loss, a.loss, kLossRel * a.loss) << "step " << s + 1;
      EXPECT_NEAR(b.ce_loss, a.ce_loss, kLossRel * a.ce_loss) << "step " << s + 1;
      EXPECT_NEAR(b.aux_loss, a.aux_loss, kLossRel * a.aux_loss) << "step " << s + 1;
      EXPECT_NEAR(b.grad_norm, a.grad_norm, kGradRel * a.grad_norm) << "step " << s + 1;
      // One all-reduce: every rank reports the same.
      EXPECT_EQ(b.loss, split.steps[0][s].loss);
      EXPECT_EQ(b.grad_norm, split.steps[0][s].grad_norm);
    }
    EXPECT_EQ(split.first[r], r * per_rank);
    const Named& w1 = one.weights[r];
    const Named& w2 = split.weights[r];
    ASSERT_EQ(w1.size(), w2.size());
    const auto start_params = start.weights.named_parameters();
    int64_t elements = 0, beyond_bulk = 0;
    double worst = 0;
    for (size_t i = 0; i < w1.size(); ++i) {
      const std::string& name = w1[i].first;
      SCOPED_TRACE(name);
      const bool stack = table.is_expert_stack(name);
      const Tensor want = stack ? w1[i].second.rows(r * per_rank, (r + 1) * per_rank) : w1[i].second;
      ASSERT_EQ(w2[i].second.shape(), want.shape());
      const std::vector<float> x = want.to_floats(), y = w2[i].second.to_floats();
      for (size_t j = 0; j < x.size(); ++j) {
        const double d = std::fabs(double(x[j]) - y[j]) / std::max(1.0f, std::fabs(x[j]));
        EXPECT_LE(d, kWeightOutlier) << "element " << j;
        beyond_bulk += d > kWeightBulk;
        worst = std::max(worst, d);
      }
      elements += static_cast<int64_t>(x.size());
      // Every parameter trained (the expert biases too), and the replicated ones agree bitwise over the ranks.
      const Tensor& initial = *start_params[i].second;
      const Tensor was = stack ? initial.rows(r * per_rank, (r + 1) * per_rank) : initial;
      EXPECT_FALSE(test::tensor_bytes_equal(was, w2[i].second)) << "did not train";
      if (!stack) {
        EXPECT_TRUE(test::tensor_bytes_equal(w2[i].second, split.weights[0][i].second)) << "the ranks disagree";
      }
    }
    EXPECT_LE(beyond_bulk, elements / 1000) << "of " << elements << " elements";
    std::printf("rank %d: weights after 3 steps: %lld of %lld elements beyond %.0e, the farthest %.3g\n", r,
                static_cast<long long>(beyond_bulk), static_cast<long long>(elements), kWeightBulk, worst);
  }

  // The EP 1 save of the EP 2 run's weights: the whole model, each stack's rows from the rank holding them.
  auto params = start.weights.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor& t = *params[i].second;
    if (!table.is_expert_stack(params[i].first)) {
      t.copy_from(split.weights[0][i].second);
      continue;
    }
    for (int r = 0; r < kWorld; ++r) t.rows(r * per_rank, (r + 1) * per_rank).copy_from(split.weights[r][i].second);
  }
  start.save_pretrained(dir.file("ep1"));
  expect_same_files(dir.file("ep1"), dir.file("ep2"));
  // And it loads back as the weights it was saved from.
  CausalLM back = CausalLM::from_pretrained(dir.file("ep2"), {DType::F32});
  const auto got = back.weights.named_parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(test::tensor_bytes_equal(*got[i].second, *params[i].second)) << params[i].first;
}

// The bf16 checkpoint as loaded (no training), saved by 2 ranks with EP 2, 4 ranks with EP 4 (one expert each),
// and 4 ranks with EP 2 (two replicas of each expert group: the first group writes): byte for byte the one-process
// save of the whole model.
TEST(CpuExpertParallelGptOss, SharedSaveOfCompactRanksIsTheWholeModelsSave) {
  io_test::ScratchDir dir;
  CausalLM whole = load_rank(0, 1, DType::BF16);
  whole.save_pretrained(dir.file("one"));
  struct Layout {
    int world;
    int64_t ep;
  };
  for (const Layout l : {Layout{2, 2}, Layout{4, 4}, Layout{4, 2}}) {
    const std::string name = "world" + std::to_string(l.world) + "_ep" + std::to_string(l.ep);
    SCOPED_TRACE(name);
    const int port = test::free_port();
    const auto err = test::run_ranks(l.world, [&](int r) {
      auto comm = tcp_communicator_create(test::env_of(r, l.world, port), std::chrono::milliseconds(20000));
      CausalLM lm = load_rank(r, l.ep, DType::BF16);
      ASSERT_EQ(lm.weights.layers[0].experts_gate_up_bias.dim(0), num_experts() / l.ep);
      const SaveShare share = save_share_for(comm.get(), r, l.world, l.ep, lm.weights.table,
                                             hf_name_map_of(lm.config, *lm.weights.table, lm.dtype));
      shared_dir_save(
          share, dir.file(name), [&](const std::string& tmp) { lm.write_pretrained_layout(tmp); },
          [&](const std::string& tmp) {
            lm.write_pretrained_rows(tmp,
                                     [&](const std::string& n, const Tensor& t) { return share.model_rows(n, t); });
          });
    });
    for (int r = 0; r < l.world; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
    expect_same_files(dir.file("one"), dir.file(name));
  }
}

}  // namespace
}  // namespace mt
