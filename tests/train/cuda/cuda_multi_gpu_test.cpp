// Training on two GPUs (`mixtune launch --nproc 2 -- finetune`, NCCL) against one GPU that accumulates
// the same micro-batches (grad_accum x 2): data parallel (parallel.ep 1) and expert parallel (ep 2, each
// GPU holding 4 of the 8 experts; tokens all-gathered, and per-slot rows sent with all_to_all) track the one-GPU loss curve over 50 steps
// within bf16 tolerance, and the expert-parallel run's final checkpoint holds every expert in its place
// (rank 1's experts gathered by rank 0). An expert-parallel run stopped at step 3 and resumed (each rank
// reading its experts' optimizer state) repeats the straight run. With one GPU the two ranks share it over
// host-staged collectives (see with_collectives); the stalled-rank test needs two GPUs (it checks NCCL's wait).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../cli/cli_process.h"
#include "../../kernels/cuda/cuda_test_util.h"
#include "cuda_train_fixture.h"
#include "kernels/cuda/device_context.h"
#include "models/causal_lm.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

// NOTE: the bitwise comparisons of GPU runs below hold by construction at this model's size: the one kernel that
// accumulates with fp32 atomics, the flash backward, adds at most two terms onto zero per element here (micro-batches
// of ≤ 128 tokens: one 128-key tile per dQ row; two query heads per KV head for dK, dV), and a + b = b + a.
// Past that (longer rows, more heads per KV head) GPU runs are not bitwise reproducible.
#define MT_SKIP_WITHOUT_TWO_GPUS()                                                        \
  do {                                                                                    \
    if (cuda::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";               \
  } while (0)

// With two GPUs the jobs use NCCL. With one, both ranks share it and exchange through the host
// (parallel.gpu_collectives: host), which runs the same engine code with every collective staged: the
// distributed logic is checked on a one-GPU machine, NCCL itself is not.
#define MT_SKIP_WITHOUT_A_GPU()                                                           \
  do {                                                                                    \
    if (cuda::device_count() < 1) GTEST_SKIP() << "needs a CUDA device";                  \
  } while (0)

std::vector<std::string> with_collectives(std::vector<std::string> sets) {
  if (cuda::device_count() < 2) sets.push_back("parallel.gpu_collectives=host");
  return sets;
}

int run(const std::vector<std::string>& args, const fs::path& log) { return test::run_mixtune(args, log); }

std::vector<std::string> finetune_args(const std::string& recipe_path, const std::vector<std::string>& sets,
                                       int nproc) {
  std::vector<std::string> a;
  if (nproc > 1) a = {"launch", "--nproc", std::to_string(nproc), "--"};
  a.push_back("finetune");
  a.push_back(recipe_path);
  for (const std::string& s : nproc > 1 ? with_collectives(sets) : sets) {
    a.push_back("--set");
    a.push_back(s);
  }
  return a;
}

// `mixtune launch --nproc N -- bench` on the test model (EP 2, 3 timed steps after 1), with `extra` appended; its
// JSON. Ranks share the GPUs over host-staged collectives when there are fewer GPUs than ranks, or always with
// `host`.
nlohmann::json launch_small_bench(const io_test::ScratchDir& dir, const std::string& name, int nproc,
                                  const std::vector<std::string>& extra, bool host = false) {
  std::vector<std::string> a = {"launch", "--nproc", std::to_string(nproc), "--", "bench", "--model", dir.file("model"),
                                "--ep", "2", "--seq", "64", "--micro-batch", "2", "--grad-accum", "2", "--steps", "3",
                                "--warmup", "1", "--json-out", (dir.path / (name + ".json")).string()};
  if (host || cuda::device_count() < nproc) a.insert(a.end(), {"--gpu-collectives", "host"});
  a.insert(a.end(), extra.begin(), extra.end());
  EXPECT_EQ(run(a, dir.path / (name + ".log")), 0) << test::slurp(dir.path / (name + ".log"));
  return nlohmann::json::parse(test::slurp(dir.path / (name + ".json")));
}

// ‖a − b‖ / ‖a‖ over every element.
double rel_l2(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  double d = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    d += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    n += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

// Expects run b's per-step loss within 2% of run a's (same batches, gradients summed in another order, bf16
// weights: differences stay at bf16 noise); returns the worst relative difference.
double expect_tracks(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(b.size(), a.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double rel = std::fabs(b[i] - a[i]) / a[i];
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 0.02) << "step " << i + 1 << ": " << b[i] << " vs one GPU " << a[i];
  }
  return worst;
}

TEST(CudaMultiGpu, DataAndExpertParallelTrackOneGpuOver50Steps) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  const std::vector<std::string> gpu = {"train.device=cuda", "model.dtype=bfloat16"};
  std::vector<std::string> one = gpu;
  one.push_back("train.grad_accum=4");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "one"), one, 1), dir.path / "one.log"), 0) << test::slurp(dir.path / "one.log");
  std::vector<std::string> dp = gpu, ep = gpu, ep_a2a = gpu;
  ep.push_back("parallel.ep=2");  // top-2 over 2 ranks: auto picks the all-gather dispatch
  ep_a2a.push_back("parallel.ep=2");
  ep_a2a.push_back("parallel.ep_dispatch=all_to_all");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "dp2"), dp, 2), dir.path / "dp2.log"), 0) << test::slurp(dir.path / "dp2.log");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "ep2"), ep, 2), dir.path / "ep2.log"), 0) << test::slurp(dir.path / "ep2.log");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "ep2a2a"), ep_a2a, 2), dir.path / "ep2a2a.log"), 0)
      << test::slurp(dir.path / "ep2a2a.log");
  const std::string ep_log = test::slurp(dir.path / "ep2.log");
  EXPECT_NE(ep_log.find("rank 0 of 2, experts 0..3 of 8"), std::string::npos) << ep_log;

  const std::vector<double> a = losses_of(dir.path / "one");
  ASSERT_EQ(a.size(), 50u);
  for (const char* run_name : {"dp2", "ep2", "ep2a2a"}) {
    SCOPED_TRACE(run_name);
    const std::vector<double> b = losses_of(dir.path / run_name);
    ASSERT_EQ(b.size(), a.size());
    const double worst = expect_tracks(a, b);
    std::printf("%s: worst relative loss difference to one GPU over 50 steps %.5f (last %.4f vs %.4f)\n", run_name,
                worst, b.back(), a.back());
    EXPECT_LT(b.back(), 0.6 * b.front());  // it learned
  }
  // Every expert of the gathered checkpoint is where the one-GPU run has it: nearest to the one-GPU run's expert
  // of its own index (any other expert differs by about the weights' own size, rel-L2 ~1.4) and within 0.1 of it
  // (after 50 bf16 steps with the gradients summed in another order, a few tokens route differently; the
  // experts of layer 1 end 0.05-0.07 apart on the 2026-12-02 run).
  CausalLM x = CausalLM::from_pretrained((dir.path / "one" / "final").string());
  CausalLM init = CausalLM::from_pretrained(dir.file("model"));
  for (const char* run_name : {"ep2", "ep2a2a"}) {
    CausalLM y = CausalLM::from_pretrained((dir.path / run_name / "final").string());
    double farthest = 0, moved_least = 1e30;
    for (size_t l = 0; l < x.weights.layers.size(); ++l) {
      const auto& X = x.weights.layers[l];
      const auto& Y = y.weights.layers[l];
      const int64_t E = X.experts_gate_up.dim(0);
      for (int64_t e = 0; e < E; ++e) {
        SCOPED_TRACE(std::string(run_name) + " layer " + std::to_string(l) + " expert " + std::to_string(e));
        for (Tensor LayerWeights::*stack : {&LayerWeights::experts_gate_up, &LayerWeights::experts_down}) {
          const double own = rel_l2((X.*stack)[e], (Y.*stack)[e]);
          farthest = std::max(farthest, own);
          EXPECT_LT(own, 0.1);
          for (int64_t o = 0; o < E; ++o) {
            if (o != e) {
              EXPECT_LT(own, rel_l2((X.*stack)[o], (Y.*stack)[e])) << "nearer to expert " << o;
            }
          }
        }
        // and training moved them (the comparison is not between two copies of the initial weights)
        const double moved = rel_l2(init.weights.layers[l].experts_down[e], X.experts_down[e]);
        moved_least = std::min(moved_least, moved);
        EXPECT_GT(moved, 0.01);
      }
    }
    std::printf("%s: experts at most %.4f from the one-GPU run's (rel-L2); training moved each at least %.4f\n",
                run_name, farthest, moved_least);
  }
}

// GPT-OSS's experts under expert parallelism on the GPU: per-expert biases split with their stacks (each rank adds and
// differentiates its experts' rows in the grouped layout), the clamped SwiGLU, the biased top-k-softmax router
// replicated. EP 2 (all-gather and per-slot all_to_all dispatch) tracks one GPU accumulating the same micro-batches
// within 2% per step over 50 steps, as above, and the gathered checkpoint holds every expert's biases where the
// one-GPU run has them (nearer to their own expert's than to any other's; the distance is printed: Adam moves a bias
// of this init's size, ~0.05, by up to lr per step, so bf16 noise in the steps' signs shows more than in weights).
TEST(CudaMultiGpu, GptOssExpertParallelTracksOneGpuOver50Steps) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir, TrainModel::gpt_oss);
  const std::vector<std::string> gpu = {"train.device=cuda", "model.dtype=bfloat16"};
  std::vector<std::string> one = gpu, ep = gpu, ep_a2a = gpu;
  one.push_back("train.grad_accum=4");
  ep.push_back("parallel.ep=2");
  ep_a2a.push_back("parallel.ep=2");
  ep_a2a.push_back("parallel.ep_dispatch=all_to_all");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "one"), one, 1), dir.path / "one.log"), 0) << test::slurp(dir.path / "one.log");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "ep2"), ep, 2), dir.path / "ep2.log"), 0) << test::slurp(dir.path / "ep2.log");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "ep2a2a"), ep_a2a, 2), dir.path / "ep2a2a.log"), 0)
      << test::slurp(dir.path / "ep2a2a.log");
  const std::vector<double> a = losses_of(dir.path / "one");
  ASSERT_EQ(a.size(), 50u);
  CausalLM x = CausalLM::from_pretrained((dir.path / "one" / "final").string());
  for (const char* run_name : {"ep2", "ep2a2a"}) {
    SCOPED_TRACE(run_name);
    const std::vector<double> b = losses_of(dir.path / run_name);
    const double worst = expect_tracks(a, b);
    std::printf("gpt-oss %s: worst relative loss difference to one GPU over 50 steps %.5f (last %.4f vs %.4f)\n",
                run_name, worst, b.back(), a.back());
    EXPECT_LT(b.back(), 0.6 * b.front());
    CausalLM y = CausalLM::from_pretrained((dir.path / run_name / "final").string());
    double farthest = 0;
    for (size_t l = 0; l < x.weights.layers.size(); ++l) {
      const auto& X = x.weights.layers[l];
      const auto& Y = y.weights.layers[l];
      const int64_t E = X.experts_gate_up_bias.dim(0);
      for (int64_t e = 0; e < E; ++e)
        for (Tensor LayerWeights::*stack : {&LayerWeights::experts_gate_up_bias, &LayerWeights::experts_down_bias}) {
          SCOPED_TRACE("layer " + std::to_string(l) + " expert " + std::to_string(e));
          const double own = rel_l2((X.*stack)[e], (Y.*stack)[e]);
          farthest = std::max(farthest, own);
          for (int64_t o = 0; o < E; ++o)
            if (o != e) {
              EXPECT_LT(own, rel_l2((X.*stack)[o], (Y.*stack)[e])) << "nearer to expert " << o;
            }
        }
    }
    std::printf("gpt-oss %s: expert biases at most %.4f from the one-GPU run's (rel-L2)\n", run_name, farthest);
  }
}

// The all-gather dispatch needs the same token count on both GPUs; an epoch's last micro-batch is shorter. With
// one document per row (pack false), 64 examples and micro-batches of 3 rows, every epoch ends with a 1-row
// micro-batch (64 = 21·3 + 1); with 2 GPUs × grad_accum 2 its peer on the other GPU has 3 rows, so those
// micro-batches take the per-slot all_to_all path inside an all_gather run (Batch::uniform_across_ranks). The run
// must finish and track one GPU fed the same micro-batches.
TEST(CudaMultiGpu, UnevenMicroBatchesFallBackToPerSlotDispatch) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  const std::vector<std::string> common = {"train.device=cuda", "model.dtype=bfloat16", "data.pack=false",
                                           "train.micro_batch_size=3", "train.max_steps=30"};
  std::vector<std::string> one = common, ep = common;
  one.push_back("train.grad_accum=4");
  ep.push_back("train.grad_accum=2");
  ep.push_back("parallel.ep=2");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "one"), one, 1), dir.path / "one.log"), 0) << test::slurp(dir.path / "one.log");
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "ep2"), ep, 2), dir.path / "ep2.log"), 0) << test::slurp(dir.path / "ep2.log");
  EXPECT_NE(test::slurp(dir.path / "one.log").find("64 examples"), std::string::npos);  // the arithmetic above
  const std::vector<double> a = losses_of(dir.path / "one"), b = losses_of(dir.path / "ep2");
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), a.size());
  const double worst = expect_tracks(a, b);
  std::printf("uneven micro-batches, EP 2: worst relative loss difference to one GPU over 30 steps %.5f\n", worst);
}

TEST(CudaMultiGpu, ExpertParallelCheckpointResumes) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  const std::vector<std::string> base = {"train.device=cuda", "parallel.ep=2", "train.max_steps=6",
                                         "checkpoint.every_steps=3"};
  ASSERT_EQ(run(finetune_args(write_recipe(dir, "straight"), base, 2), dir.path / "straight.log"), 0)
      << test::slurp(dir.path / "straight.log");
  std::vector<std::string> stop3 = base;
  stop3.push_back("train.max_steps=3");
  const std::string resumed = write_recipe(dir, "resumed");
  ASSERT_EQ(run(finetune_args(resumed, stop3, 2), dir.path / "r1.log"), 0) << test::slurp(dir.path / "r1.log");
  std::vector<std::string> again = finetune_args(resumed, base, 2);
  again.push_back("--resume");
  ASSERT_EQ(run(again, dir.path / "r2.log"), 0) << test::slurp(dir.path / "r2.log");
  const std::vector<double> a = losses_of(dir.path / "straight"), b = losses_of(dir.path / "resumed");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-3 * a[i]) << "step " << i + 1;
  // The fp32 masters of both ranks' experts reached the checkpoint.
  CausalLM s = CausalLM::from_pretrained((dir.path / "straight" / "final").string());
  CausalLM r = CausalLM::from_pretrained((dir.path / "resumed" / "final").string());
  ASSERT_EQ(s.weights.embed.dtype(), DType::F32);
  for (size_t l = 0; l < s.weights.layers.size(); ++l)
    EXPECT_LT(rel_l2(s.weights.layers[l].experts_gate_up, r.weights.layers[l].experts_gate_up), 1e-3) << "layer " << l;
}

// ZeRO-1 on the GPUs (parallel.shard_optimizer, the default): each replicated tensor's AdamW state (fp32 master
// and moments) on one owner GPU, updated there and broadcast over NCCL. The update and its stochastic-rounding
// stream are the unsharded ones, so data parallel and EP 2 runs are bitwise the runs with the state on both
// GPUs: the same losses, the same final checkpoint and optimizer file bytes (each owner wrote its tensors).
TEST(CudaMultiGpu, ShardedOptimizerStateTrainsBitwiseLikeReplicated) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  for (const std::string ep : {"1", "2"}) {
    SCOPED_TRACE("ep " + ep);
    auto job = [&](const std::string& name, bool shard) {
      return finetune_args(write_recipe(dir, name),
                           {"train.device=cuda", "parallel.ep=" + ep, "train.max_steps=6", "checkpoint.every_steps=3",
                            std::string("parallel.shard_optimizer=") + (shard ? "true" : "false")},
                           2);
    };
    const std::string sharded = "sharded" + ep, whole = "whole" + ep;
    ASSERT_EQ(run(job(sharded, true), dir.path / (sharded + ".log")), 0) << test::slurp(dir.path / (sharded + ".log"));
    ASSERT_EQ(run(job(whole, false), dir.path / (whole + ".log")), 0) << test::slurp(dir.path / (whole + ".log"));
    EXPECT_NE(test::slurp(dir.path / (sharded + ".log")).find("sharded over 2 ranks (ZeRO-1)"), std::string::npos)
        << test::slurp(dir.path / (sharded + ".log"));
    EXPECT_EQ(losses_of(dir.path / sharded), losses_of(dir.path / whole));
    EXPECT_EQ(test::slurp(dir.path / sharded / "checkpoint-000006" / "optimizer.safetensors"),
              test::slurp(dir.path / whole / "checkpoint-000006" / "optimizer.safetensors"));
    for (const auto& f : fs::directory_iterator(dir.path / whole / "final")) {
      if (f.path().extension() == ".safetensors") {
        EXPECT_EQ(test::slurp(f.path()), test::slurp(dir.path / sharded / "final" / f.path().filename()))
            << f.path().filename();
      }
    }
  }
}

// ZeRO-3 on the GPUs (parallel.shard_parameters): each replicated parameter lives on its owner GPU only and is
// broadcast per layer group for each use (prefetched on a side stream). Every GPU computes with the owner's
// bytes, so data parallel and EP 2 runs, with either reshard policy, are bitwise the ZeRO-1 runs: the same
// losses, optimizer file and final checkpoint. Resharding after the forward holds fewer parameters: rank 0's
// peak allocated memory is below ZeRO-1's.
TEST(CudaMultiGpu, ShardedParametersTrainBitwiseLikeZero1) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  auto peak = [&](const std::string& name) {
    return metrics_of(dir.path / name).back()["peak_memory_bytes"].get<int64_t>();
  };
  for (const std::string ep : {"1", "2"}) {
    SCOPED_TRACE("ep " + ep);
    auto job = [&](const std::string& name, const std::vector<std::string>& extra) {
      std::vector<std::string> sets = {"train.device=cuda", "parallel.ep=" + ep, "train.max_steps=6",
                                       "checkpoint.every_steps=3"};
      sets.insert(sets.end(), extra.begin(), extra.end());
      return finetune_args(write_recipe(dir, name), sets, 2);
    };
    const std::string zero1 = "zero1_" + ep;
    ASSERT_EQ(run(job(zero1, {}), dir.path / (zero1 + ".log")), 0) << test::slurp(dir.path / (zero1 + ".log"));
    for (const std::string reshard : {"true", "false"}) {
      SCOPED_TRACE("reshard_after_forward " + reshard);
      const std::string name = "zero3_" + ep + "_" + reshard;
      ASSERT_EQ(run(job(name, {"parallel.shard_parameters=true", "parallel.reshard_after_forward=" + reshard}),
                    dir.path / (name + ".log")),
                0)
          << test::slurp(dir.path / (name + ".log"));
      EXPECT_NE(test::slurp(dir.path / (name + ".log")).find("the parameters too (ZeRO-3"), std::string::npos);
      EXPECT_EQ(losses_of(dir.path / name), losses_of(dir.path / zero1));
      EXPECT_EQ(test::slurp(dir.path / name / "checkpoint-000006" / "optimizer.safetensors"),
                test::slurp(dir.path / zero1 / "checkpoint-000006" / "optimizer.safetensors"));
      for (const auto& f : fs::directory_iterator(dir.path / zero1 / "final")) {
        if (f.path().extension() == ".safetensors") {
          EXPECT_EQ(test::slurp(f.path()), test::slurp(dir.path / name / "final" / f.path().filename()))
              << f.path().filename();
        }
      }
    }
    const int64_t p1 = peak(zero1), p3 = peak("zero3_" + ep + "_true"), p3keep = peak("zero3_" + ep + "_false");
    std::printf("ep %s: rank 0 peak allocated: ZeRO-1 %lld bytes, ZeRO-3 %lld (resharded) / %lld (kept to the "
                "backward)\n",
                ep.c_str(), static_cast<long long>(p1), static_cast<long long>(p3), static_cast<long long>(p3keep));
    EXPECT_LT(p3, p1);
  }
}

// Four ranks, EP 2 (two replicas of each expert group), all sharing the GPUs through host-staged collectives
// (which sum in rank order like an all-reduce): the replicated run (the experts' gradients all-reduced over the
// replica communicator), ZeRO-1 (gradients reduced onto their owners; each expert stack's state on one of its two
// replicas, its gradient reduced there and its norm taken from the owners' EP group) and ZeRO-3 end bitwise
// alike (losses, optimizer file — every expert row written by its owner — and final checkpoint, whose fp32
// masters the owners write). ZeRO-1 resumed from its step-2 checkpoint (each owner reading its experts' rows)
// ends on the uninterrupted run's checkpoint bytes.
TEST(CudaMultiGpu, FourRanksWithExpertReplicasShardBitwiseLikeReplicated) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  auto job = [&](const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> sets = {"train.device=cuda", "parallel.ep=2", "parallel.gpu_collectives=host",
                                     "train.max_steps=4", "checkpoint.every_steps=2", "checkpoint.keep_last=3"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return finetune_args(write_recipe(dir, name), sets, 4);
  };
  ASSERT_EQ(run(job("whole", {"parallel.shard_optimizer=false"}), dir.path / "whole.log"), 0)
      << test::slurp(dir.path / "whole.log");
  EXPECT_NE(test::slurp(dir.path / "whole.log").find("rank 0 of 4, experts 0..3 of 8"), std::string::npos)
      << test::slurp(dir.path / "whole.log");
  for (const std::string name : {"zero1", "zero3"}) {
    SCOPED_TRACE(name);
    std::vector<std::string> extra;
    if (name == "zero3") extra.push_back("parallel.shard_parameters=true");
    ASSERT_EQ(run(job(name, extra), dir.path / (name + ".log")), 0) << test::slurp(dir.path / (name + ".log"));
    EXPECT_NE(test::slurp(dir.path / (name + ".log")).find("the experts' over their 2 replicas"), std::string::npos)
        << test::slurp(dir.path / (name + ".log"));
    if (name == "zero3") {  // the expert stacks' weights too, fetched from their owner among the replicas per layer
      EXPECT_NE(test::slurp(dir.path / (name + ".log")).find("; the expert stacks over their replicas)"),
                std::string::npos)
          << test::slurp(dir.path / (name + ".log"));
      const auto peak = [&](const std::string& n) {
        return metrics_of(dir.path / n).back()["peak_memory_bytes"].get<int64_t>();
      };
      EXPECT_LT(peak("zero3"), peak("zero1"));
      std::printf("4 ranks, EP 2: rank 0 peak allocated %lld bytes with ZeRO-1, %lld with ZeRO-3 (expert stacks "
                  "too)\n",
                  static_cast<long long>(peak("zero1")), static_cast<long long>(peak("zero3")));
    }
    EXPECT_EQ(losses_of(dir.path / name), losses_of(dir.path / "whole"));
    EXPECT_EQ(test::slurp(dir.path / name / "checkpoint-000004" / "optimizer.safetensors"),
              test::slurp(dir.path / "whole" / "checkpoint-000004" / "optimizer.safetensors"));
    for (const auto& f : fs::directory_iterator(dir.path / "whole" / "final")) {
      if (f.path().extension() == ".safetensors") {
        EXPECT_EQ(test::slurp(f.path()), test::slurp(dir.path / name / "final" / f.path().filename()))
            << f.path().filename();
      }
    }
  }
}

// ZeRO-1 and ZeRO-3 (the expert stacks' weights on their owner among the replicas: on resume each owner reads its
// stacks from the checkpoint, the others none).
TEST(CudaMultiGpu, FourRanksWithExpertReplicasResumeBitwise) {
  MT_SKIP_WITHOUT_A_GPU();
  for (const bool zero3 : {false, true}) {
    SCOPED_TRACE(zero3 ? "ZeRO-3" : "ZeRO-1");
    io_test::ScratchDir dir;
    write_model_and_data(dir);
    const std::string recipe = write_recipe(dir, "zero1");
    std::vector<std::string> sets = {"train.device=cuda", "parallel.ep=2", "parallel.gpu_collectives=host",
                                     "train.max_steps=4", "checkpoint.every_steps=2", "checkpoint.keep_last=3"};
    if (zero3) sets.push_back("parallel.shard_parameters=true");
    ASSERT_EQ(run(finetune_args(recipe, sets, 4), dir.path / "straight.log"), 0) << test::slurp(dir.path / "straight.log");
    const fs::path run_dir = dir.path / "zero1";
    ASSERT_TRUE(fs::is_directory(run_dir / "checkpoint-000002")) << test::slurp(dir.path / "straight.log");
    fs::rename(run_dir / "final", dir.path / "uninterrupted");
    fs::rename(run_dir / "checkpoint-000004", dir.path / "uninterrupted-4");
    std::ofstream(run_dir / "latest") << "checkpoint-000002\n";
    std::vector<std::string> again = finetune_args(recipe, sets, 4);
    again.push_back("--resume");
    ASSERT_EQ(run(again, dir.path / "resume.log"), 0) << test::slurp(dir.path / "resume.log");
    EXPECT_NE(test::slurp(dir.path / "resume.log").find("resumed from"), std::string::npos);
    EXPECT_EQ(test::slurp(run_dir / "checkpoint-000004" / "optimizer.safetensors"),
              test::slurp(dir.path / "uninterrupted-4" / "optimizer.safetensors"));
    size_t files = 0;
    for (const auto& f : fs::directory_iterator(dir.path / "uninterrupted")) {
      if (f.path().extension() == ".safetensors") {
        EXPECT_EQ(test::slurp(f.path()), test::slurp(run_dir / "final" / f.path().filename())) << f.path().filename();
        ++files;
      }
    }
    EXPECT_GT(files, 0u);
  }
}

// `mixtune bench` under four ranks with EP 2 (two replicas of each expert group), ZeRO-1 on (each expert stack's
// AdamW state on one of its two replicas, the replicated tensors' on one of the four ranks) and off: the same
// synthetic batches train to the same first and last loss bit for bit (host-staged collectives sum in rank
// order, so the reduces give the all-reduces' sums; over NCCL the world reduce of four ranks may add in another
// order), and the largest rank's optimizer state is smaller with sharding — by at least half of the experts'
// state it held — and within the memory plan's count (which now counts the experts' share). ZeRO-3 on top
// (--shard-parameters: the expert stacks' weights too) trains to the same losses with a lower peak.
TEST(CudaMultiGpu, BenchFourRanksShardExpertStateOverReplicas) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  // Host-staged always: over NCCL the 4-rank world reduce may add in another order than the all-reduce.
  auto bench = [&](const std::string& name, bool shard) {
    return launch_small_bench(dir, name, 4, shard ? std::vector<std::string>{}
                                                  : std::vector<std::string>{"--no-shard-optimizer"}, true);
  };
  const nlohmann::json sharded = bench("sharded", true), whole = bench("whole", false);
  // ZeRO-3 as well: the expert stacks' weights on their owner among the two replicas, fetched per layer.
  const nlohmann::json zero3 = launch_small_bench(dir, "zero3", 4, {"--shard-parameters"}, true);
  EXPECT_EQ(zero3["loss_first"].get<double>(), sharded["loss_first"].get<double>());
  EXPECT_EQ(zero3["loss_last"].get<double>(), sharded["loss_last"].get<double>());
  EXPECT_LT(zero3["peak_allocated_bytes"].get<int64_t>(), sharded["peak_allocated_bytes"].get<int64_t>());
  EXPECT_TRUE(sharded["shard_optimizer"].get<bool>());
  EXPECT_FALSE(whole["shard_optimizer"].get<bool>());
  EXPECT_EQ(sharded["loss_first"].get<double>(), whole["loss_first"].get<double>());
  EXPECT_EQ(sharded["loss_last"].get<double>(), whole["loss_last"].get<double>());
  EXPECT_NE(sharded["loss_last"].get<double>(), sharded["loss_first"].get<double>());  // it trained
  const int64_t s = sharded["optimizer_state_bytes"].get<int64_t>(), w = whole["optimizer_state_bytes"].get<int64_t>();
  // bf16: two bf16 moments per parameter. A rank holds 4 of the 8 experts of each of the 2 MoE layers:
  // 4 × 3 × moe_intermediate_size (64) × hidden_size (128) parameters a layer.
  const int64_t expert_state = 2 * 4 * 3 * 64 * 128 * 2 * 2;
  EXPECT_LE(s, w - expert_state / 2) << "sharded " << s << " bytes, unsharded " << w;
  EXPECT_LE(s, sharded["memory_plan_optimizer_bytes"].get<int64_t>());
  EXPECT_LE(w, whole["memory_plan_optimizer_bytes"].get<int64_t>());
  EXPECT_LT(sharded["memory_plan_optimizer_bytes"].get<int64_t>(), whole["memory_plan_optimizer_bytes"].get<int64_t>());
  std::printf("bench, 4 ranks EP 2: largest rank's optimizer state %lld bytes sharded, %lld unsharded (plan %lld / "
              "%lld)\n",
              static_cast<long long>(s), static_cast<long long>(w),
              static_cast<long long>(sharded["memory_plan_optimizer_bytes"].get<int64_t>()),
              static_cast<long long>(whole["memory_plan_optimizer_bytes"].get<int64_t>()));
}

// `mixtune bench` under two ranks with ZeRO-3 (--shard-parameters; EP 2, bf16) trains the synthetic batches
// exactly as with ZeRO-1: the same first and last loss, bit for bit. (With one GPU both ranks share it over
// host-staged collectives, --gpu-collectives host.)
TEST(CudaMultiGpu, BenchShardedParametersTrainLikeZero1) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  auto bench = [&](const std::string& name, bool shard) {
    return launch_small_bench(dir, name, 2, shard ? std::vector<std::string>{"--shard-parameters"}
                                                  : std::vector<std::string>{});
  };
  const nlohmann::json z1 = bench("zero1", false), z3 = bench("zero3", true);
  EXPECT_FALSE(z1["shard_parameters"].get<bool>());
  EXPECT_TRUE(z3["shard_parameters"].get<bool>());
  EXPECT_EQ(z3["loss_first"].get<double>(), z1["loss_first"].get<double>());
  EXPECT_EQ(z3["loss_last"].get<double>(), z1["loss_last"].get<double>());
  EXPECT_NE(z3["loss_last"].get<double>(), z3["loss_first"].get<double>());  // it trained
  std::printf("bench, EP 2: peak allocated per GPU ZeRO-1 %lld bytes, ZeRO-3 %lld\n",
              static_cast<long long>(z1["peak_allocated_bytes"].get<int64_t>()),
              static_cast<long long>(z3["peak_allocated_bytes"].get<int64_t>()));
}

// The all-gather dispatch without a host read of the expert row counts (distributed/ep_row_budget.h): after the
// first step (exact counts) each layer sizes its expert buffers from the budget, checked on the GPU and read at
// the step's sync. EP 2 runs with a budget (headroom 2, so that no step of the tiny model's noisy loads passes
// it), with headroom 0 (the count read on the host for every layer and micro-batch) and with headroom 0.5 (under
// the load already seen: every later step passes it on some layer, drops the rows past it, and runs again with
// exact counts) end bitwise alike: the same losses, the same final checkpoint. The forced run logs each rerun.
TEST(CudaMultiGpu, ExpertRowBudgetTrainsBitwiseLikeExactCounts) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  auto job = [&](const std::string& name, const std::string& headroom) {
    return finetune_args(write_recipe(dir, name),
                         {"train.device=cuda", "model.dtype=bfloat16", "parallel.ep=2", "train.max_steps=6",
                          "parallel.ep_row_headroom=" + headroom},
                         2);
  };
  for (const auto& [name, headroom] : std::vector<std::pair<std::string, std::string>>{
           {"exact", "0"}, {"budget", "2"}, {"forced", "0.5"}}) {
    ASSERT_EQ(run(job(name, headroom), dir.path / (name + ".log")), 0) << test::slurp(dir.path / (name + ".log"));
  }
  const std::string forced_log = test::slurp(dir.path / "forced.log");
  int reruns = 0;
  for (size_t at = 0; (at = forced_log.find("ran again with exact row counts", at)) != std::string::npos; ++at) ++reruns;
  EXPECT_EQ(reruns, 5) << forced_log;  // every step after the first
  EXPECT_EQ(test::slurp(dir.path / "budget.log").find("ran again"), std::string::npos);
  EXPECT_EQ(losses_of(dir.path / "budget"), losses_of(dir.path / "exact"));
  EXPECT_EQ(losses_of(dir.path / "forced"), losses_of(dir.path / "exact"));
  ASSERT_EQ(losses_of(dir.path / "exact").size(), 6u);
  for (const auto& f : fs::directory_iterator(dir.path / "exact" / "final")) {
    if (f.path().extension() != ".safetensors") continue;
    for (const char* other : {"budget", "forced"})
      EXPECT_EQ(test::slurp(f.path()), test::slurp(dir.path / other / "final" / f.path().filename()))
          << other << " " << f.path().filename();
  }
}

// `mixtune bench` reports the host reads of row counts per step: none with a budget (headroom 2, past the noise of
// the synthetic batches' loads; the timed steps come after the exact warm-up step), one per MoE layer and
// micro-batch with --ep-row-headroom 0, and as many in every step that reruns (--ep-row-headroom 0.5: all of
// them); the losses agree bit for bit.
TEST(CudaMultiGpu, BenchReportsNoHostReadsOfExpertRowsUnderTheBudget) {
  MT_SKIP_WITHOUT_A_GPU();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  const nlohmann::json budget = launch_small_bench(dir, "budget", 2, {"--ep-row-headroom", "2"});
  const nlohmann::json exact = launch_small_bench(dir, "exact", 2, {"--ep-row-headroom", "0"});
  const nlohmann::json forced = launch_small_bench(dir, "forced", 2, {"--ep-row-headroom", "0.5"});
  const nlohmann::json &b = budget["all_to_all"], &e = exact["all_to_all"], &f = forced["all_to_all"];
  ASSERT_EQ(b["mode"], "all_gather");
  // The test model's 2 MoE layers × grad-accum 2.
  EXPECT_EQ(b["host_count_reads_per_step"].get<double>(), 0.0);
  EXPECT_EQ(e["host_count_reads_per_step"].get<double>(), 4.0);
  EXPECT_EQ(f["host_count_reads_per_step"].get<double>(), 4.0);
  EXPECT_EQ(b["row_budget"]["steps_rerun"].get<int64_t>(), 0);
  EXPECT_EQ(f["row_budget"]["steps_rerun"].get<int64_t>(), 3);
  EXPECT_EQ(e["row_budget"]["ratio_to_even_share"].get<double>(), 0.0);
  EXPECT_GE(b["row_budget"]["ratio_to_even_share"].get<double>(), 2.0);  // twice at least the even share (the max)
  for (const nlohmann::json* other : {&exact, &forced}) {
    EXPECT_EQ((*other)["loss_first"].get<double>(), budget["loss_first"].get<double>());
    EXPECT_EQ((*other)["loss_last"].get<double>(), budget["loss_last"].get<double>());
  }
  std::printf("bench EP 2: budget %.3f of the even share, host reads per step %.0f (budget) / %.0f (exact), "
              "host wait %.3f / %.3f ms per step\n",
              b["row_budget"]["ratio_to_even_share"].get<double>(), b["host_count_reads_per_step"].get<double>(),
              e["host_count_reads_per_step"].get<double>(), b["host_wait_for_counts_ms_per_step"].get<double>(),
              e["host_wait_for_counts_ms_per_step"].get<double>());
}

// A rank that stops answering (MIXTUNE_TEST_STALL: rank 1 hangs before step 3) makes rank 0's NCCL wait give up
// after parallel.timeout_s with the layer and the operation named; the launcher then stops the hung rank, the
// job exits non-zero within seconds, and no checkpoint is marked latest. Both expert dispatches: the all_gather
// step queues every layer without a host wait (the row budget), so its step-end wait times out and names the
// first unfinished collective, layer 0's token all-gather; all_to_all's first wait is layer 0's read of the row
// counts.
TEST(CudaMultiGpu, StalledRankTimesOutWithLayerAndOperationNamed) {
  MT_SKIP_WITHOUT_TWO_GPUS();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  struct Case {
    const char* mode;
    const char* first_wait;
  };
  for (const Case& c : {Case{"all_gather", "first unfinished collective: expert-parallel group: layer 0: all_gather"},
                        Case{"all_to_all", "layer 0: expert dispatch plan"}}) {
    SCOPED_TRACE(c.mode);
    const std::string name = std::string("stall_") + c.mode;
    const std::vector<std::string> sets = {"train.device=cuda", "parallel.ep=2", "parallel.timeout_s=5",
                                           "train.max_steps=6", std::string("parallel.ep_dispatch=") + c.mode};
    ::setenv("MIXTUNE_TEST_STALL", "1:3", 1);
    const auto t0 = std::chrono::steady_clock::now();
    // The job runs in its own process group so that a hang (the failure this test looks for) is ended by the
    // test, not left holding the GPUs.
    const std::vector<std::string> args = finetune_args(write_recipe(dir, name), sets, 2);
    const fs::path log_path = dir.path / (name + ".log");
    const pid_t pid = fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(test::mixtune_binary()));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(test::mixtune_binary(), argv.data());
      _exit(127);
    }
    ::unsetenv("MIXTUNE_TEST_STALL");
    int status = 0, rc = -1;
    while (true) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(90)) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string log = test::slurp(log_path);
    ASSERT_GE(rc, 0) << "the job hung for 90 s and was killed:\n" << log;
    EXPECT_NE(rc, 0) << log;
    EXPECT_LT(secs, 60.0) << log;
    EXPECT_NE(log.find("did not complete within 5 s"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 0"), std::string::npos) << log;
    EXPECT_NE(log.find(c.first_wait), std::string::npos) << log;
    EXPECT_EQ(losses_of(dir.path / name).size(), 2u);  // steps 1 and 2 finished
    EXPECT_FALSE(fs::exists(dir.path / name / "latest"));
    EXPECT_FALSE(fs::exists(dir.path / name / "final"));
  }
}

}  // namespace
}  // namespace mt
