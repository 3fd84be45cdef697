// `mixtune finetune` as a process: a bad recipe is one line + exit 1; SIGTERM mid-run writes a checkpoint and
// exits 143, and --resume finishes the run; SIGTERM while a rank waits at the rendezvous ends it at once.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../distributed/thread_ranks.h"
#include "cli_process.h"

namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/";

using mt::test::slurp;
using mt::test::wait_exit;

pid_t spawn(const std::vector<std::string>& args, const fs::path& log) { return mt::test::spawn_mixtune(args, log); }

// Whether a socket of this network namespace listens on TCP port `port` (IPv4, /proc/net/tcp).
bool tcp_listening(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  char want[8];
  std::snprintf(want, sizeof(want), ":%04X", port);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    f >> slot >> local >> remote >> state;
    if (state == "0A" && local.size() > 5 && local.compare(local.size() - 5, 5, want) == 0) return true;
  }
  return false;
}

size_t lines_in(const fs::path& p) {
  const std::string s = slurp(p);
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

class FinetuneCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("mt_finetune_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "recipe.yaml") << "model: {path: " << kFixtures << "moe_gqa_aux/ckpt, dtype: float32}\n"
                                       << "data: {train: " << kFixtures << "train5/train.jsonl, seq_len: 16}\n"
                                       << "train: {max_steps: 1000000}\n"
                                       << "optimizer: {lr: 1.0e-4}\n"
                                       << "checkpoint: {dir: " << (dir / "run").string() << "}\n";
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(FinetuneCli, BadRecipeIsOneLineError) {
  std::ofstream(dir / "bad.yaml") << "model: {path: x}\ndata: {train: y, seq_lenn: 3}\ncheckpoint: {dir: z}\n";
  const pid_t pid = spawn({"finetune", (dir / "bad.yaml").string()}, dir / "log");
  EXPECT_EQ(wait_exit(pid), 1);
  const std::string log = slurp(dir / "log");
  EXPECT_EQ(log.rfind("mixtune: error: ", 0), 0u) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_NE(log.find("unknown key 'data.seq_lenn'"), std::string::npos) << log;
}

TEST_F(FinetuneCli, SigtermCheckpointsAndResumeFinishes) {
  const pid_t pid = spawn({"finetune", (dir / "recipe.yaml").string()}, dir / "log");
  const fs::path metrics = dir / "run" / "metrics.jsonl";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((!fs::exists(metrics) || lines_in(metrics) < 3) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(lines_in(metrics), 3u) << slurp(dir / "log");
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 143) << slurp(dir / "log");
  const std::string latest = slurp(dir / "run" / "latest");
  ASSERT_EQ(latest.rfind("checkpoint-", 0), 0u) << latest;
  const fs::path ckpt = dir / "run" / latest.substr(0, latest.size() - 1);
  EXPECT_TRUE(fs::exists(ckpt / "trainer_state.json"));
  EXPECT_TRUE(fs::exists(ckpt / "optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "run" / "final"));
  const int64_t step = std::stoll(latest.substr(std::string("checkpoint-").size()));
  // The metrics end at the checkpointed step.
  EXPECT_EQ(lines_in(metrics), static_cast<size_t>(step));

  const pid_t resumed = spawn({"finetune", (dir / "recipe.yaml").string(), "--resume", "--set",
                               "train.max_steps=" + std::to_string(step + 2)},
                              dir / "log2");
  EXPECT_EQ(wait_exit(resumed), 0) << slurp(dir / "log2");
  EXPECT_TRUE(fs::exists(dir / "run" / "final" / "config.json"));
  EXPECT_EQ(lines_in(metrics), static_cast<size_t>(step + 2));
  EXPECT_NE(slurp(dir / "log2").find("resumed from"), std::string::npos);
}

// Rank 0 of a two-rank job whose rank 1 never comes waits at the rendezvous for parallel.timeout_s; a signal
// there has nothing to checkpoint, so it must end the process at once instead of being held for the end of a
// first step that never starts.
TEST_F(FinetuneCli, SigtermDuringRendezvousEndsAtOnce) {
  const int port = mt::test::free_port();
  const pid_t pid = mt::test::spawn_program(
      mt::test::mixtune_binary(), {"finetune", (dir / "recipe.yaml").string(), "--set", "parallel.timeout_s=120"},
      dir / "log", {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"},
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!tcp_listening(port) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(tcp_listening(port)) << slurp(dir / "log");
  const auto t0 = std::chrono::steady_clock::now();
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 143) << slurp(dir / "log");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_FALSE(fs::exists(dir / "run" / "latest"));
}

}  // namespace
