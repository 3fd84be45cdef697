// `mixtune launch` end to end on the CPU: data-parallel runs of 2 and 4 ranks against one process that
// accumulates the same micro-batches (grad_accum x ranks), on the moe_gqa_aux fixture (fp32): the loss and
// grad-norm trajectories must agree within 1e-6 relative and the final weights within 1e-5 (they are bitwise equal
// with one micro-batch per rank: the gradients are summed in rank order = micro-batch order). Then the
// launcher's process handling: the rank variables, and a failing rank taking the job down.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli_process.h"
#include "distributed/launcher.h"
#include "distributed/mpi_bootstrap.h"
#include "distributed/process_group_env.h"
#include "distributed/tcp_socket.h"
#include "../distributed/mpirun_util.h"
#include "../distributed/thread_ranks.h"
#include "io/safetensors.h"
#include "train/train_engine.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/";

using test::slurp;

int run(const std::vector<std::string>& args, const fs::path& log) { return test::run_mixtune(args, log); }

std::vector<nlohmann::json> metrics_of(const fs::path& run_dir) {
  std::vector<nlohmann::json> v;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) v.push_back(nlohmann::json::parse(line));
  return v;
}

// mpirun's arguments (tests/distributed/mpirun_util.h) for `-np N mixtune args...`.
std::vector<std::string> mpirun_args(int np, const std::vector<std::string>& extra,
                                     const std::vector<std::string>& mixtune_args) {
  return test::mpirun_args(np, extra, test::mixtune_binary(), mixtune_args);
}

// The variables a job under mpirun must not inherit from the test's environment.
const std::vector<std::string> kRendezvousVars = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                  "LOCAL_WORLD_SIZE"};

class LaunchCli : public ::testing::Test {
 protected:
  fs::path dir;

  void SetUp() override {
    dir = fs::temp_directory_path() / ("mt_launch_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  fs::path recipe(const std::string& name, int grad_accum, const std::string& model = kFixtures + "moe_gqa_aux/ckpt") {
    const fs::path p = dir / (name + ".yaml");
    std::ofstream(p) << "model: {path: " << model << ", dtype: float32}\n"
                     << "data: {train: " << kFixtures << "train5/train.jsonl, seq_len: 16}\n"
                     << "train: {max_steps: 4, grad_accum: " << grad_accum << ", device: cpu, seed: 7}\n"
                     << "optimizer: {lr: 1.0e-3, weight_decay: 0.01}\n"
                     << "checkpoint: {dir: " << (dir / name).string() << "}\n"
                     << "parallel: {timeout_s: 60}\n";
    return p;
  }

  // The multi-rank run matches the single-process run step by step and in the final weights.
  void expect_same_run(const std::string& single, const std::string& multi) {
    const auto a = metrics_of(dir / single), b = metrics_of(dir / multi);
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(i + 1));
      for (const char* key : {"loss", "ce_loss", "aux_loss", "grad_norm"}) {
        const double x = a[i][key], y = b[i][key];
        EXPECT_LE(std::fabs(x - y), 1e-6 * std::fabs(x)) << key << ": " << x << " vs " << y;
      }
      EXPECT_EQ(a[i]["tokens"], b[i]["tokens"]);
      EXPECT_EQ(a[i]["trained_tokens"], b[i]["trained_tokens"]);
    }
    expect_same_weights(dir / single / "final", dir / multi / "final");
  }

  // Run `b` is bitwise run `a`: every step's losses and grad norm, the optimizer file of each named checkpoint and
  // every file of the final model.
  void expect_bitwise_same_run(const std::string& a_name, const std::string& b_name,
                               const std::vector<std::string>& checkpoints) {
    const auto a = metrics_of(dir / a_name), b = metrics_of(dir / b_name);
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 4u);
    for (size_t i = 0; i < a.size(); ++i)
      for (const char* key : {"loss", "ce_loss", "aux_loss", "grad_norm"})
        EXPECT_EQ(a[i][key].get<double>(), b[i][key].get<double>()) << key << " at step " << i + 1;
    for (const std::string& ck : checkpoints)
      EXPECT_EQ(slurp(dir / a_name / ck / "optimizer.safetensors"), slurp(dir / b_name / ck / "optimizer.safetensors"))
          << ck;
    for (const auto& f : fs::directory_iterator(dir / a_name / "final")) {
      if (f.path().extension() == ".safetensors") {
        EXPECT_EQ(slurp(f.path()), slurp(dir / b_name / "final" / f.path().filename())) << f.path().filename();
      }
    }
  }

  // Every tensor of the model files in `a` matches `b`'s within 1e-5 relative (to max(1, |x|)). Runs that sum in
  // another order (more micro-batches per rank, expert GEMMs over several ranks' rows) have gradients within fp32
  // reassociation, K·u·Σ|a·b|; AdamW's m/√v is scale-free, so that moves an update by about lr times the gradient's
  // relative change, far below 1e-6 for most elements, but more where a gradient nearly cancels. Measured over
  // OpenBLAS's core types (Haswell, SkylakeX, Prescott, Atom): ≤ 9.2e-7 after 4 steps of lr 1e-3 (EP 4). We allow
  // 1e-5, 1% of one step's lr.
  static void expect_same_weights(const fs::path& a, const fs::path& b) {
    size_t tensors = 0;
    for (const auto& f : fs::directory_iterator(a)) {
      if (f.path().extension() != ".safetensors") continue;
      SafetensorsFile wa = SafetensorsFile::open(f.path().string());
      SafetensorsFile wb = SafetensorsFile::open((b / f.path().filename()).string());
      for (const std::string& name : wa.names()) {
        const std::vector<float> x = wa.tensor(name).to_floats(), y = wb.tensor(name).to_floats();
        ASSERT_EQ(x.size(), y.size()) << name;
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_LE(std::fabs(x[i] - y[i]), 1e-5 * std::max(1.0f, std::fabs(x[i]))) << name << " element " << i;
        ++tensors;
      }
    }
    EXPECT_GT(tensors, 10u);
  }
};

TEST_F(LaunchCli, TwoAndFourRanksTrainLikeOneProcess) {
  ASSERT_EQ(run({"finetune", recipe("single2", 2).string()}, dir / "single2.log"), 0) << slurp(dir / "single2.log");
  ASSERT_EQ(run({"launch", "--nproc", "2", "--", "finetune", recipe("ranks2", 1).string()}, dir / "ranks2.log"), 0)
      << slurp(dir / "ranks2.log");
  expect_same_run("single2", "ranks2");
  const std::string log2 = slurp(dir / "ranks2.log");
  EXPECT_NE(log2.find("2 ranks (torchrun-style variables"), std::string::npos) << log2;

  ASSERT_EQ(run({"finetune", recipe("single4", 4).string()}, dir / "single4.log"), 0) << slurp(dir / "single4.log");
  ASSERT_EQ(run({"launch", "--nproc", "4", "--", "finetune", recipe("ranks4", 1).string()}, dir / "ranks4.log"), 0)
      << slurp(dir / "ranks4.log");
  expect_same_run("single4", "ranks4");
  // Two ranks with two micro-batches each against one process with four: the same batches, the gradient
  // sums in another order (not bitwise: the bounds of expect_same_run).
  ASSERT_EQ(run({"launch", "--nproc", "2", "--", "finetune", recipe("ranks2x2", 2).string()}, dir / "ranks2x2.log"), 0)
      << slurp(dir / "ranks2x2.log");
  expect_same_run("single4", "ranks2x2");
}

// GPT-OSS (tests/fixtures/gpt_oss/yarn_window_aux: 4 experts with biases and the clamped SwiGLU, a biased router,
// sinks, the aux loss) with EP 2 over two launched ranks: each rank loads and trains its experts' weight and bias
// rows only, and the run matches one process accumulating the same two micro-batches within the bounds of
// tests/train/cpu_expert_parallel_gpt_oss_test.cpp (losses 1e-6, gradient norm 1e-5 relative; weights: at most 0.1%
// of the elements beyond 1e-6, none beyond lr — an element whose gradient sits within Adam's eps of zero moves its
// update by lr·|Δg|/eps; measured over OpenBLAS's core types: at most 6 of 46576 beyond 1e-6, the farthest 5.2e-5).
// Its final model, written by both ranks into the shared files, is complete (the one-process save's files and
// tensors). Resumed from its step-2 checkpoint (the expert stacks' AdamW state, biases included, written by their
// ranks and read back by them), it ends bitwise on the uninterrupted run.
TEST_F(LaunchCli, GptOssExpertParallelTrainsLikeOneProcessAndResumes) {
  const std::string model = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/gpt_oss/yarn_window_aux/ckpt";
  ASSERT_EQ(run({"finetune", recipe("single2", 2, model).string()}, dir / "single2.log"), 0)
      << slurp(dir / "single2.log");
  auto job = [&](bool resume) {
    std::vector<std::string> a{"launch", "--nproc", "2", "--", "finetune", recipe("ep2", 1, model).string(),
                               "--set", "parallel.ep=2", "--set", "checkpoint.every_steps=2"};
    if (resume) a.push_back("--resume");
    return a;
  };
  ASSERT_EQ(run(job(false), dir / "ep2.log"), 0) << slurp(dir / "ep2.log");
  const auto a = metrics_of(dir / "single2"), b = metrics_of(dir / "ep2");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    for (const char* key : {"loss", "ce_loss", "aux_loss", "grad_norm"}) {
      const double x = a[i][key], y = b[i][key];
      EXPECT_LE(std::fabs(x - y), (std::string(key) == "grad_norm" ? 1e-5 : 1e-6) * std::fabs(x))
          << key << ": " << x << " vs " << y;
    }
    EXPECT_GT(a[i]["aux_loss"].get<double>(), 0.0);
    EXPECT_EQ(a[i]["tokens"], b[i]["tokens"]);
  }
  auto files_of = [](const fs::path& d) {
    std::set<std::string> names;
    for (const auto& f : fs::directory_iterator(d)) names.insert(f.path().filename().string());
    return names;
  };
  EXPECT_EQ(files_of(dir / "ep2" / "final"), files_of(dir / "single2" / "final"));
  int64_t elements = 0, beyond = 0;
  double farthest = 0;
  for (const std::string& file : files_of(dir / "single2" / "final")) {
    if (fs::path(file).extension() != ".safetensors") continue;
    SafetensorsFile wa = SafetensorsFile::open((dir / "single2" / "final" / file).string());
    SafetensorsFile wb = SafetensorsFile::open((dir / "ep2" / "final" / file).string());
    EXPECT_EQ(wa.names(), wb.names()) << file;
    for (const std::string& name : wa.names()) {
      const std::vector<float> x = wa.tensor(name).to_floats(), y = wb.tensor(name).to_floats();
      ASSERT_EQ(x.size(), y.size()) << name;
      for (size_t i = 0; i < x.size(); ++i) {
        const double d = std::fabs(double(x[i]) - y[i]) / std::max(1.0f, std::fabs(x[i]));
        ASSERT_LE(d, 1e-3) << name << " element " << i;  // lr
        beyond += d > 1e-6;
        farthest = std::max(farthest, d);
      }
      elements += static_cast<int64_t>(x.size());
    }
  }
  EXPECT_GT(elements, 30000);
  EXPECT_LE(beyond, elements / 1000);
  std::printf("GPT-OSS EP 2 vs one process after 4 steps: %lld of %lld weights beyond 1e-6, the farthest %.3g\n",
              static_cast<long long>(beyond), static_cast<long long>(elements), farthest);

  const fs::path run_dir = dir / "ep2";
  fs::rename(run_dir / "final", dir / "ep2-final");
  fs::remove_all(run_dir / "checkpoint-000004");
  std::ofstream(run_dir / "latest") << "checkpoint-000002\n";
  ASSERT_EQ(run(job(true), dir / "ep2-resume.log"), 0) << slurp(dir / "ep2-resume.log");
  EXPECT_NE(slurp(dir / "ep2-resume.log").find("resumed from"), std::string::npos);
  for (const auto& f : fs::directory_iterator(dir / "ep2-final"))
    if (f.path().extension() == ".safetensors") {
      EXPECT_EQ(slurp(f.path()), slurp(run_dir / "final" / f.path().filename())) << f.path().filename();
    }
}

// ZeRO-1 (parallel.shard_optimizer, on by default): each replicated tensor's AdamW state on one owner rank,
// which updates it and broadcasts the result. The gradients and the update are the unsharded ones, so the run is
// bitwise the run with the state on every rank: metrics, final weights and the consolidated optimizer file
// (written by the owners into one file) all equal. With EP 2 the experts stay with expert parallelism.
TEST_F(LaunchCli, ShardedOptimizerStateTrainsBitwiseLikeReplicated) {
  for (const std::string ep : {"1", "2"}) {
    SCOPED_TRACE("ep " + ep);
    auto job = [&](const std::string& name, bool shard) {
      return std::vector<std::string>{"launch", "--nproc", "2", "--", "finetune", recipe(name, 1).string(),
                                      "--set", "parallel.ep=" + ep, "--set", "checkpoint.every_steps=2",
                                      "--set", std::string("parallel.shard_optimizer=") + (shard ? "true" : "false")};
    };
    const std::string sharded = "sharded" + ep, whole = "whole" + ep;
    ASSERT_EQ(run(job(sharded, true), dir / (sharded + ".log")), 0) << slurp(dir / (sharded + ".log"));
    ASSERT_EQ(run(job(whole, false), dir / (whole + ".log")), 0) << slurp(dir / (whole + ".log"));
    EXPECT_NE(slurp(dir / (sharded + ".log")).find("sharded over 2 ranks (ZeRO-1)"), std::string::npos)
        << slurp(dir / (sharded + ".log"));
    EXPECT_EQ(slurp(dir / (whole + ".log")).find("ZeRO-1"), std::string::npos);
    expect_bitwise_same_run(whole, sharded, {"checkpoint-000002", "checkpoint-000004"});
  }
}

// ZeRO-1 of the expert stacks over their replicas: four ranks, EP 2 (ranks {0, 2} hold experts 0-3, {1, 3}
// experts 4-7), so each stack's AdamW state lives on one of the two ranks holding its experts, which receives the
// reduced gradient, updates and broadcasts to the other. The run is bitwise the unsharded one (metrics, both
// checkpoints' optimizer files — every expert row written by its owner — and the final model), and the log
// names the sharding and a smaller largest-rank state. Resumed from its step-2 checkpoint, the sharded run ends
// bitwise on the uninterrupted one (the step-4 optimizer file too); the unsharded run's checkpoint resumes under
// sharding bitwise as well (the file does not depend on the layout); and the sharded checkpoint resumes at
// another layout (EP 4: each rank 2 experts, no replicas) to the same weights within fp32 summation order.
TEST_F(LaunchCli, ExpertStateShardedOverReplicasTrainsAndResumesLikeUnsharded) {
  auto job = [&](const std::string& name, const std::vector<std::string>& sets, bool resume) {
    std::vector<std::string> a{"launch", "--nproc", "4", "--", "finetune", recipe(name, 1).string(),
                               "--set", "checkpoint.every_steps=2", "--set", "checkpoint.keep_last=3"};
    for (const std::string& x : sets) a.insert(a.end(), {"--set", x});
    if (resume) a.push_back("--resume");
    return a;
  };
  const std::vector<std::string> sharded = {"parallel.ep=2"}, whole = {"parallel.ep=2", "parallel.shard_optimizer=false"};
  ASSERT_EQ(run(job("sharded", sharded, false), dir / "sharded.log"), 0) << slurp(dir / "sharded.log");
  ASSERT_EQ(run(job("whole", whole, false), dir / "whole.log"), 0) << slurp(dir / "whole.log");
  const std::string log = slurp(dir / "sharded.log");
  EXPECT_NE(log.find("sharded over 4 ranks (ZeRO-1), the experts' over their 2 replicas; the largest rank keeps"),
            std::string::npos)
      << log;
  EXPECT_EQ(slurp(dir / "whole.log").find("ZeRO-1"), std::string::npos);
  expect_bitwise_same_run("whole", "sharded", {"checkpoint-000002", "checkpoint-000004"});

  // Back to step 2 of a run: its final model and step-4 checkpoint set aside, `latest` at step 2.
  auto rewind = [&](const std::string& name) {
    const fs::path run_dir = dir / name;
    fs::rename(run_dir / "final", dir / (name + "-final"));
    fs::rename(run_dir / "checkpoint-000004", dir / (name + "-checkpoint-000004"));
    std::ofstream(run_dir / "latest") << "checkpoint-000002\n";
  };
  auto expect_bitwise_files = [&](const fs::path& a, const fs::path& b) {
    size_t files = 0;
    for (const auto& f : fs::directory_iterator(a)) {
      if (f.path().extension() != ".safetensors") continue;
      EXPECT_EQ(slurp(f.path()), slurp(b / f.path().filename())) << f.path();
      ++files;
    }
    EXPECT_GT(files, 1u) << a;
  };
  rewind("sharded");
  ASSERT_EQ(run(job("sharded", sharded, true), dir / "sharded-resume.log"), 0) << slurp(dir / "sharded-resume.log");
  EXPECT_NE(slurp(dir / "sharded-resume.log").find("resumed from"), std::string::npos);
  expect_bitwise_files(dir / "sharded-final", dir / "sharded" / "final");
  expect_bitwise_files(dir / "sharded-checkpoint-000004", dir / "sharded" / "checkpoint-000004");

  rewind("whole");
  ASSERT_EQ(run(job("whole", sharded, true), dir / "whole-resume.log"), 0) << slurp(dir / "whole-resume.log");
  expect_bitwise_files(dir / "whole-final", dir / "whole" / "final");

  // The sharded run's step-2 checkpoint at EP 4 (it resumed above: rewind it again).
  fs::remove_all(dir / "sharded-final");
  fs::remove_all(dir / "sharded-checkpoint-000004");
  rewind("sharded");
  ASSERT_EQ(run(job("sharded", {"parallel.ep=4"}, true), dir / "ep4-resume.log"), 0) << slurp(dir / "ep4-resume.log");
  expect_same_weights(dir / "sharded-final", dir / "sharded" / "final");
}

// ZeRO-3 (parallel.shard_parameters): the replicated parameters themselves live on their owner rank and are
// broadcast per layer for each use. The values every rank computes with are the owner's, so the run is bitwise
// the unsharded one (metrics, optimizer files, final weights), for both reshard policies and with EP 2; and
// rank 0's peak memory (reset once the engine is built) is below the ZeRO-1 run's; a resumed run ends bitwise where
// the uninterrupted one did; four ranks with EP 2 (two copies of each expert group, so the expert stacks are
// sharded over them too) are bitwise the unsharded four-rank run, with a lower peak.
TEST_F(LaunchCli, ShardedParametersTrainBitwiseLikeReplicated) {
  auto job = [&](const std::string& name, const std::string& ep, const std::vector<std::string>& sets) {
    std::vector<std::string> a{"launch", "--nproc", "2", "--", "finetune", recipe(name, 1).string(),
                               "--set", "parallel.ep=" + ep, "--set", "checkpoint.every_steps=2"};
    for (const std::string& s : sets) a.insert(a.end(), {"--set", s});
    return a;
  };
  auto peak = [&](const std::string& name) { return metrics_of(dir / name).back()["peak_memory_bytes"].get<int64_t>(); };
  for (const std::string ep : {"1", "2"}) {
    SCOPED_TRACE("ep " + ep);
    const std::string whole = "whole" + ep, zero1 = "zero1" + ep;
    ASSERT_EQ(run(job(whole, ep, {"parallel.shard_optimizer=false"}), dir / (whole + ".log")), 0)
        << slurp(dir / (whole + ".log"));
    ASSERT_EQ(run(job(zero1, ep, {}), dir / (zero1 + ".log")), 0) << slurp(dir / (zero1 + ".log"));
    for (const std::string reshard : {"true", "false"}) {
      SCOPED_TRACE("reshard_after_forward " + reshard);
      const std::string name = "zero3" + ep + reshard;
      ASSERT_EQ(run(job(name, ep, {"parallel.shard_parameters=true", "parallel.reshard_after_forward=" + reshard}),
                    dir / (name + ".log")),
                0)
          << slurp(dir / (name + ".log"));
      EXPECT_NE(slurp(dir / (name + ".log")).find("the parameters too (ZeRO-3, reshard after forward: " +
                                                  std::string(reshard == "true" ? "yes" : "no") + ")"),
                std::string::npos)
          << slurp(dir / (name + ".log"));
      expect_bitwise_same_run(whole, name, {"checkpoint-000002", "checkpoint-000004"});
    }
    // Resharding after the forward holds one layer's fetched tensors at a time: below ZeRO-1's peak.
    EXPECT_LT(peak("zero3" + ep + "true"), peak(zero1)) << "ZeRO-1 " << peak(zero1) << ", ZeRO-3 "
                                                         << peak("zero3" + ep + "true");
    std::printf("ep %s: rank 0 peak memory: ZeRO-1 %lld bytes, ZeRO-3 %lld (resharded) / %lld (kept to the backward)\n",
                ep.c_str(), static_cast<long long>(peak(zero1)), static_cast<long long>(peak("zero3" + ep + "true")),
                static_cast<long long>(peak("zero3" + ep + "false")));
    // Resuming a sharded-parameter run from its step-2 checkpoint ends with the uninterrupted run's weights.
    {
      const std::string name = "zero3" + ep + "true";
      const fs::path run_dir = dir / name;
      fs::rename(run_dir / "final", dir / (name + "-uninterrupted"));
      fs::remove_all(run_dir / "checkpoint-000004");
      std::ofstream(run_dir / "latest") << "checkpoint-000002\n";
      std::vector<std::string> a =
          job(name, ep, {"parallel.shard_parameters=true", "parallel.reshard_after_forward=true"});
      a.push_back("--resume");
      ASSERT_EQ(run(a, dir / (name + "-resume.log")), 0) << slurp(dir / (name + "-resume.log"));
      EXPECT_NE(slurp(dir / (name + "-resume.log")).find("resumed from"), std::string::npos);
      for (const auto& f : fs::directory_iterator(dir / (name + "-uninterrupted"))) {
        if (f.path().extension() == ".safetensors") {
          EXPECT_EQ(slurp(f.path()), slurp(run_dir / "final" / f.path().filename())) << f.path().filename();
        }
      }
    }
  }
  // Four ranks, experts in groups of two (two replicas of each expert group): the replicated parameters are
  // spread over four owners, and the run is still bitwise the unsharded four-rank run.
  {
    auto job4 = [&](const std::string& name, const std::vector<std::string>& sets) {
      std::vector<std::string> a{"launch", "--nproc", "4", "--", "finetune", recipe(name, 1).string(),
                                 "--set", "parallel.ep=2"};
      for (const std::string& x : sets) a.insert(a.end(), {"--set", x});
      return a;
    };
    ASSERT_EQ(run(job4("whole4", {"parallel.shard_optimizer=false"}), dir / "whole4.log"), 0) << slurp(dir / "whole4.log");
    ASSERT_EQ(run(job4("zero3x4", {"parallel.shard_parameters=true"}), dir / "zero3x4.log"), 0)
        << slurp(dir / "zero3x4.log");
    EXPECT_NE(slurp(dir / "zero3x4.log").find("; the expert stacks over their replicas)"), std::string::npos)
        << slurp(dir / "zero3x4.log");
    expect_bitwise_same_run("whole4", "zero3x4", {});
    // Each rank holds about half of its expert group's stacks and a quarter of the replicated tensors between uses.
    EXPECT_LT(peak("zero3x4"), peak("whole4"));
    std::printf("4 ranks, EP 2: rank 0 peak memory %lld bytes unsharded, %lld with ZeRO-3 (expert stacks too)\n",
                static_cast<long long>(peak("whole4")), static_cast<long long>(peak("zero3x4")));
  }
  // A sharded-parameter job needs the optimizer state sharded too (its owner updates the parameter).
  ASSERT_EQ(run(job("bad", "1", {"parallel.shard_parameters=true", "parallel.shard_optimizer=false"}),
                dir / "bad.log"),
            1);
  EXPECT_NE(slurp(dir / "bad.log").find("parallel.shard_parameters: needs parallel.shard_optimizer true"),
            std::string::npos)
      << slurp(dir / "bad.log");
}

// Expert parallelism (parallel.ep): each MoE layer's 8 experts split over groups of 2 or 4 ranks, token rows
// exchanged with all_to_allv; the trajectories (1e-6) and final weights (1e-5) match one process (the expert
// GEMMs sum rows of several ranks in one pass, so not bitwise).
TEST_F(LaunchCli, ExpertParallelRanksTrainLikeOneProcess) {
  ASSERT_EQ(run({"finetune", recipe("single2", 2).string()}, dir / "single2.log"), 0) << slurp(dir / "single2.log");
  ASSERT_EQ(run({"launch", "--nproc", "2", "--", "finetune", recipe("ep2", 1).string(), "--set", "parallel.ep=2"},
                dir / "ep2.log"),
            0)
      << slurp(dir / "ep2.log");
  expect_same_run("single2", "ep2");
  EXPECT_NE(slurp(dir / "ep2.log").find("experts split over groups of 2 ranks"), std::string::npos)
      << slurp(dir / "ep2.log");
  ASSERT_EQ(run({"finetune", recipe("single4", 4).string()}, dir / "single4.log"), 0) << slurp(dir / "single4.log");
  ASSERT_EQ(run({"launch", "--nproc", "4", "--", "finetune", recipe("ep4", 1).string(), "--set", "parallel.ep=4"},
                dir / "ep4.log"),
            0)
      << slurp(dir / "ep4.log");
  expect_same_run("single4", "ep4");
  ASSERT_EQ(run({"launch", "--nproc", "4", "--", "finetune", recipe("ep2x2", 1).string(), "--set", "parallel.ep=2"},
                dir / "ep2x2.log"),
            0)
      << slurp(dir / "ep2x2.log");
  expect_same_run("single4", "ep2x2");
}

// Under expert parallelism each expert lives on one rank of a group (its weights, gradient and AdamW moments;
// tests/train/cpu_expert_parallel_test.cpp counts the bytes), and the checkpoint the ranks write together is the
// one process's: two ranks with ep 2 against one process accumulating the same micro-batches, at step 2, every
// model tensor and every optimizer-state tensor (all 8 experts' moments, each expert's rows written by the rank
// holding it) within fp32 summation order. From that checkpoint the two ranks resume with every expert on each
// rank (ep 1) and end with the one process's weights.
TEST_F(LaunchCli, ExpertParallelCheckpointIsTheOneProcessCheckpoint) {
  ASSERT_EQ(run({"finetune", recipe("single", 2).string(), "--set", "checkpoint.every_steps=2"}, dir / "single.log"), 0)
      << slurp(dir / "single.log");
  auto job = [&](const std::string& ep, bool resume) {
    std::vector<std::string> a{"launch", "--nproc", "2", "--", "finetune", recipe("split", 1).string(),
                               "--set", "parallel.ep=" + ep, "--set", "checkpoint.every_steps=2"};
    if (resume) a.push_back("--resume");
    return a;
  };
  ASSERT_EQ(run(job("2", false), dir / "split.log"), 0) << slurp(dir / "split.log");
  const fs::path a = dir / "single" / "checkpoint-000002", b = dir / "split" / "checkpoint-000002";
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(a)) {
    if (f.path().extension() != ".safetensors") continue;
    SCOPED_TRACE(f.path().filename().string());
    SafetensorsFile fa = SafetensorsFile::open(f.path().string());
    SafetensorsFile fb = SafetensorsFile::open((b / f.path().filename()).string());
    ASSERT_EQ(fa.names(), fb.names());
    for (const std::string& name : fa.names()) {
      const std::vector<float> x = fa.tensor(name).to_floats(), y = fb.tensor(name).to_floats();
      ASSERT_EQ(x.size(), y.size()) << name;
      double diff = 0, norm = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double d = static_cast<double>(x[i]) - y[i];
        diff += d * d;
        norm += static_cast<double>(x[i]) * x[i];
      }
      EXPECT_GT(norm, 0) << name << " is all zeros";
      EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << name;
    }
    ++files;
  }
  EXPECT_EQ(files, 8u);  // the 7 model shards and optimizer.safetensors
  fs::remove_all(dir / "split" / "final");
  fs::remove_all(dir / "split" / "checkpoint-000004");
  std::ofstream(dir / "split" / "latest") << "checkpoint-000002\n";
  ASSERT_EQ(run(job("1", true), dir / "resume.log"), 0) << slurp(dir / "resume.log");
  EXPECT_NE(slurp(dir / "resume.log").find("resumed from"), std::string::npos) << slurp(dir / "resume.log");
  expect_same_weights(dir / "single" / "final", dir / "split" / "final");
}

TEST_F(LaunchCli, ExpertParallelSizeMustDivide) {
  ASSERT_EQ(run({"launch", "--nproc", "2", "--", "finetune", recipe("bad3", 1).string(), "--set", "parallel.ep=3"},
                dir / "bad3.log"),
            1);
  EXPECT_NE(slurp(dir / "bad3.log").find("parallel.ep: 3 does not divide the 2 ranks of this job"), std::string::npos)
      << slurp(dir / "bad3.log");
  ASSERT_EQ(run({"launch", "--nproc", "3", "--", "finetune", recipe("bad8", 1).string(), "--set", "parallel.ep=3"},
                dir / "bad8.log"),
            1);
  EXPECT_NE(slurp(dir / "bad8.log").find("parallel.ep: 3 does not divide the model's 8 experts"), std::string::npos)
      << slurp(dir / "bad8.log");
  ASSERT_EQ(run({"finetune", recipe("bad1", 1).string(), "--set", "parallel.ep=2"}, dir / "bad1.log"), 1);
  EXPECT_NE(slurp(dir / "bad1.log").find("parallel.ep: 2 does not divide the 1 rank of this job"), std::string::npos)
      << slurp(dir / "bad1.log");
}

// SIGTERM to launch reaches every rank; they agree on the step to stop after, the ranks checkpoint together
// (experts split over the two ranks: each writes its experts' rows, train/shared_save.h), the job exits 143;
// a two-rank --resume finishes the run, and a one-process resume of it is refused.
TEST_F(LaunchCli, SigtermCheckpointsAndTwoRankResumeFinishes) {
  const fs::path p = recipe("stop", 1);
  const fs::path metrics = dir / "stop" / "metrics.jsonl";
  const pid_t pid = test::spawn_mixtune(
      {"launch", "--nproc", "2", "--", "finetune", p.string(), "--set", "train.max_steps=1000000", "--set",
       "parallel.ep=2"},
      dir / "stop.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((!fs::exists(metrics) || metrics_of(dir / "stop").size() < 3) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(metrics_of(dir / "stop").size(), 3u) << slurp(dir / "stop.log");
  kill(pid, SIGTERM);
  EXPECT_EQ(test::wait_exit(pid), 143) << slurp(dir / "stop.log");
  const std::string latest = slurp(dir / "stop" / "latest");
  ASSERT_EQ(latest.rfind("checkpoint-", 0), 0u) << latest << slurp(dir / "stop.log");
  const int64_t step = std::stoll(latest.substr(std::string("checkpoint-").size()));
  EXPECT_EQ(metrics_of(dir / "stop").size(), static_cast<size_t>(step));

  EXPECT_EQ(run({"finetune", p.string(), "--resume"}, dir / "one.log"), 1);
  EXPECT_NE(slurp(dir / "one.log").find("world_size is 1 in the recipe but was 2"), std::string::npos)
      << slurp(dir / "one.log");
  ASSERT_EQ(run({"launch", "--nproc", "2", "--", "finetune", p.string(), "--resume", "--set",
                 "train.max_steps=" + std::to_string(step + 2), "--set", "parallel.ep=2"},
                dir / "resume.log"),
            0)
      << slurp(dir / "resume.log");
  EXPECT_TRUE(fs::exists(dir / "stop" / "final" / "config.json"));
  EXPECT_EQ(metrics_of(dir / "stop").size(), static_cast<size_t>(step + 2));
  // The checkpoint the ranks wrote together reads back whole: no weight tensor (half of the experts written
  // by rank 1) is left as a zero-filled hole of the laid-out files (the weights start random, never all zero).
  const fs::path ck = dir / "stop" / latest.substr(0, latest.find('\n'));
  int64_t expert_tensors = 0;
  for (const auto& f : fs::directory_iterator(ck)) {
    if (f.path().extension() != ".safetensors" || f.path().filename() == "optimizer.safetensors") continue;
    SafetensorsFile w = SafetensorsFile::open(f.path().string());
    for (const std::string& name : w.names()) {
      const std::vector<float> v = w.tensor(name).to_floats();
      bool any = false;
      for (float x : v) any = any || x != 0.0f;
      EXPECT_TRUE(any) << name << " is all zeros";
      expert_tensors += name.find(".mlp.experts.") != std::string::npos;
    }
  }
  EXPECT_GT(expert_tensors, 8);
}

// The checkpoint the ranks write together holds every expert in place (one consolidated HF model and optimizer
// file), so a run can resume at another expert-parallel layout: 4 ranks with experts in groups of 2 save at
// step 2; from that checkpoint, 4 ranks with every rank owning 2 of the 8 experts finish steps 3-4 and end with
// the weights of the uninterrupted run (within 1e-5, expect_same_weights: the expert sums are split differently).
TEST_F(LaunchCli, ResumesAtAnotherExpertParallelLayout) {
  const fs::path p = recipe("layout", 1);
  auto job = [&](const std::string& ep, bool resume) {
    std::vector<std::string> a = {"launch", "--nproc", "4", "--", "finetune", p.string(), "--set",
                                  "parallel.ep=" + ep, "--set", "checkpoint.every_steps=2", "--set",
                                  "checkpoint.keep_last=3"};
    if (resume) a.push_back("--resume");
    return a;
  };
  ASSERT_EQ(run(job("2", false), dir / "full.log"), 0) << slurp(dir / "full.log");
  const fs::path run_dir = dir / "layout";
  ASSERT_TRUE(fs::is_directory(run_dir / "checkpoint-000002")) << slurp(dir / "full.log");
  fs::rename(run_dir / "final", dir / "uninterrupted");
  fs::remove_all(run_dir / "checkpoint-000004");
  std::ofstream(run_dir / "latest") << "checkpoint-000002\n";
  ASSERT_EQ(run(job("4", true), dir / "resume.log"), 0) << slurp(dir / "resume.log");
  EXPECT_NE(slurp(dir / "resume.log").find("resumed from"), std::string::npos) << slurp(dir / "resume.log");
  expect_same_weights(dir / "uninterrupted", run_dir / "final");
}

// Two "nodes" on loopback: two launchers (--nnodes 2, --node-rank 0 / 1, the same --master) of two ranks each
// form one job of four ranks with experts split over groups of two (ranks 2 and 3 on node 1 hold a replica of
// the experts of ranks 0 and 1); it trains like one process accumulating the same four micro-batches, and the
// shared save (node 1's ranks take part, write nothing) leaves the same final model.
TEST_F(LaunchCli, TwoNodesOnLoopbackTrainLikeOneProcess) {
  ASSERT_EQ(run({"finetune", recipe("single4", 4).string()}, dir / "single4.log"), 0) << slurp(dir / "single4.log");
  const int port = test::free_port();  // node 0's rendezvous (node 1 retries until it listens)
  const fs::path p = recipe("nodes", 1);
  auto node = [&](int rank) -> std::vector<std::string> {
    return {"launch", "--nproc", "2", "--nnodes", "2", "--node-rank", std::to_string(rank), "--master",
            "127.0.0.1:" + std::to_string(port), "--", "finetune", p.string(), "--set", "parallel.ep=2"};
  };
  const pid_t second = test::spawn_mixtune(node(1), dir / "node1.log");
  const int first = run(node(0), dir / "node0.log");
  const int second_rc = test::wait_exit(second);
  ASSERT_EQ(first, 0) << slurp(dir / "node0.log") << slurp(dir / "node1.log");
  ASSERT_EQ(second_rc, 0) << slurp(dir / "node1.log");
  EXPECT_NE(slurp(dir / "node0.log").find("4 ranks"), std::string::npos) << slurp(dir / "node0.log");
  expect_same_run("single4", "nodes");
}

// Each rank of a multi-rank job takes the GPU of its LOCAL_RANK; without enough GPUs train.device cuda is
// refused with the rank's device named (tests/train/cuda/cuda_multi_gpu_test.cpp trains on two GPUs).
TEST_F(LaunchCli, MultiRankJobWithoutGpusRefusesCudaDevice) {
  if (const CudaEngineHooks* h = cuda_engine_hooks(); h && h->device_count() >= 2)
    GTEST_SKIP() << "two GPUs present: the job would train on them";
  fs::path p = recipe("cuda", 1);
  ASSERT_NE(run({"launch", "--nproc", "2", "--", "finetune", p.string(), "--set", "train.device=cuda"},
                dir / "cuda.log"),
            0);
  const std::string log = slurp(dir / "cuda.log");
  const bool no_devices = log.find("local rank 1 needs CUDA device 1") != std::string::npos ||
                          log.find("local rank 0 needs CUDA device 0") != std::string::npos;
  const bool no_cuda_build = log.find("has no CUDA support") != std::string::npos;
  EXPECT_TRUE(no_devices || no_cuda_build) << log;
  // cuda:N names one device: refused for a job of several ranks on a CUDA build.
  ASSERT_NE(run({"launch", "--nproc", "2", "--", "finetune", p.string(), "--set", "train.device=cuda:0"},
                dir / "cuda0.log"),
            0);
  const std::string log0 = slurp(dir / "cuda0.log");
  EXPECT_TRUE(log0.find("each rank uses the GPU of its LOCAL_RANK") != std::string::npos ||
              log0.find("has no CUDA support") != std::string::npos)
      << log0;
}

// Open MPI's mpirun starts the ranks, with no MASTER_ADDR / MASTER_PORT anywhere: a build with MPI bootstraps
// through it (rank 0 listens on a free port, MPI broadcasts where) and trains bitwise like `mixtune launch` with
// the same ranks and layout (EP 2).
TEST_F(LaunchCli, MpirunBootstrapsThroughMpiAndTrainsLikeLaunch) {
  if (!mpi_built()) GTEST_SKIP() << "built without MPI (-DMIXTUNE_MPI=OFF)";
  const std::string mpirun = test::find_on_path("mpirun");
  ASSERT_FALSE(mpirun.empty()) << "mpirun is not on PATH (apt-get install openmpi-bin)";
  ASSERT_EQ(run({"launch", "--nproc", "2", "--", "finetune", recipe("launched", 1).string(), "--set", "parallel.ep=2"},
                dir / "launched.log"),
            0)
      << slurp(dir / "launched.log");
  const int rc = test::wait_exit(test::spawn_program(
      mpirun, mpirun_args(2, {}, {"finetune", recipe("mpi", 1).string(), "--set", "parallel.ep=2"}), dir / "mpi.log",
      kRendezvousVars));
  ASSERT_EQ(rc, 0) << slurp(dir / "mpi.log");
  const std::string log = slurp(dir / "mpi.log");
  EXPECT_NE(log.find("2 ranks (OpenMPI (OMPI_COMM_WORLD_*), rendezvous through MPI)"), std::string::npos) << log;
  expect_bitwise_same_run("launched", "mpi", {});
  // A MASTER_ADDR / MASTER_PORT the user gives is where the ranks meet (only NCCL's ids would use MPI).
  const std::string master = "MASTER_ADDR=127.0.0.1", port = "MASTER_PORT=" + std::to_string(test::free_port());
  ASSERT_EQ(test::wait_exit(test::spawn_program(
                mpirun,
                mpirun_args(2, {"-x", master, "-x", port},
                            {"finetune", recipe("given", 1).string(), "--set", "parallel.ep=2"}),
                dir / "given.log", kRendezvousVars)),
            0)
      << slurp(dir / "given.log");
  const std::string given = slurp(dir / "given.log");
  EXPECT_NE(given.find("2 ranks (OpenMPI (OMPI_COMM_WORLD_*)), data parallel"), std::string::npos) << given;
  expect_bitwise_same_run("launched", "given", {});
}

// Under mpirun a MASTER_PORT that another process holds stops the job with rank 0's bind error, quickly.
TEST_F(LaunchCli, MpirunWithABusyMasterPortFails) {
  if (!mpi_built()) GTEST_SKIP() << "built without MPI (-DMIXTUNE_MPI=OFF)";
  const std::string mpirun = test::find_on_path("mpirun");
  ASSERT_FALSE(mpirun.empty()) << "mpirun is not on PATH (apt-get install openmpi-bin)";
  int port = 0;
  const Socket busy = tcp_listen("0.0.0.0", 0, &port, "test: busy port");
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = test::wait_exit(test::spawn_program(
      mpirun, mpirun_args(2, {"-x", "MASTER_PORT=" + std::to_string(port)}, {"finetune", recipe("busy", 1).string()}),
      dir / "busy.log", kRendezvousVars));
  EXPECT_NE(rc, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  const std::string log = slurp(dir / "busy.log");
  EXPECT_NE(log.find("rank 0: rendezvous listener: cannot listen on 0.0.0.0:" + std::to_string(port)),
            std::string::npos)
      << log;
  EXPECT_FALSE(fs::exists(dir / "busy" / "final"));
}

// Ranks started the way srun starts them (SLURM_PROCID, SLURM_STEP_NUM_TASKS, ...; no MASTER_ADDR / MASTER_PORT) meet
// on the first host of SLURM_STEP_NODELIST at the port the job and step ids give, and train bitwise like
// `mixtune launch`. (No srun here: the test sets the variables srun would.)
TEST_F(LaunchCli, SrunStyleRanksMeetOnTheNodeListsFirstHost) {
  ASSERT_EQ(run({"launch", "--nproc", "2", "--", "finetune", recipe("launched", 1).string(), "--set", "parallel.ep=2"},
                dir / "launched.log"),
            0)
      << slurp(dir / "launched.log");
  int port = 0;
  for (int i = 0; i < 50 && (port < 20000 || port >= 60000); ++i) port = test::free_port();
  ASSERT_TRUE(port >= 20000 && port < 60000) << "no free port in 20000..59999";
  const std::string job = std::to_string((port - 20000) / 4), step = std::to_string((port - 20000) % 4);
  ASSERT_EQ(slurm_rendezvous_port(std::stoull(job), std::stoull(step)), port);
  const fs::path p = recipe("srun", 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(test::spawn_program(
        test::mixtune_binary(), {"finetune", p.string(), "--set", "parallel.ep=2"},
        dir / ("srun" + std::to_string(r) + ".log"), kRendezvousVars,
        {{"SLURM_PROCID", std::to_string(r)}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_NTASKS", "2"},
         {"SLURM_LOCALID", std::to_string(r)}, {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "0"},
         {"SLURM_STEP_NODELIST", "localhost"}, {"SLURM_JOB_ID", job}, {"SLURM_STEP_ID", step}}));
  }
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(test::wait_exit(pids[r]), 0) << slurp(dir / ("srun" + std::to_string(r) + ".log"));
  const std::string log = slurp(dir / "srun0.log");
  EXPECT_NE(log.find("2 ranks (Slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS), rendezvous on the first host of "
                     "SLURM_STEP_NODELIST)"),
            std::string::npos)
      << log;
  expect_bitwise_same_run("launched", "srun", {});
}

TEST_F(LaunchCli, RanksGetTheirVariables) {
  LaunchOptions o;
  o.nproc = 3;
  o.program = "/bin/sh";
  o.args = {"-c", "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
                  "${MIXTUNE_RENDEZVOUS_FD:--1} > " +
                      (dir / "rank.").string() + "$RANK"};
  ASSERT_EQ(launch_ranks(o), 0);
  std::string port;
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(dir / ("rank." + std::to_string(r)));
    int rank = -1, world = -1, local = -1, local_world = -1;
    std::string addr, p;
    int fd = -2;
    in >> rank >> world >> local >> local_world >> addr >> p >> fd;
    // Rank 0 inherits launch's rendezvous listener (no race for the port); the others get no descriptor.
    if (r == 0) {
      EXPECT_GE(fd, 0);
    } else {
      EXPECT_EQ(fd, -1);
    }
    EXPECT_EQ(rank, r);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(local, r);
    EXPECT_EQ(local_world, 3);
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_NE(p, "0");
    if (r > 0) {
      EXPECT_EQ(p, port);
    }
    port = p;
  }
}

TEST_F(LaunchCli, FailingRankStopsTheJob) {
  LaunchOptions o;
  o.nproc = 3;
  o.program = "/bin/sh";
  o.args = {"-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60"};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(launch_ranks(o), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20)) << "the surviving ranks were not stopped";
}

TEST_F(LaunchCli, BadOptionsAreErrors) {
  EXPECT_EQ(run({"launch", "--nproc", "0", "--", "finetune", "x.yaml"}, dir / "a.log"), 1);
  EXPECT_NE(slurp(dir / "a.log").find("--nproc 0 must be in 1..1024"), std::string::npos) << slurp(dir / "a.log");
  EXPECT_EQ(run({"launch", "--nproc", "2", "--master", "nohost", "--", "finetune", "x.yaml"}, dir / "b.log"), 1);
  EXPECT_NE(slurp(dir / "b.log").find("'nohost' is not HOST:PORT"), std::string::npos) << slurp(dir / "b.log");
}

}  // namespace
}  // namespace mt
