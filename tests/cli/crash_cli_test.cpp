// Crash hygiene of `mixtune finetune` as processes (docs/checkpoints.md): SIGKILL at seeded random moments, many
// of them inside a save, with --resume after each: `latest` always names a loadable checkpoint, the leftovers
// are removed, and the run ends with the bytes of an uninterrupted one. A second finetune on a directory in use
// is refused at once; a dead one does not block. A save that hits the file-size limit or a full disk fails in
// one line, leaves the previous checkpoint and `latest` as they were, and --resume continues. Two ranks: rank 1
// dying in the middle of a shared save leaves the previous checkpoint, and the job resumes to the same bytes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../distributed/thread_ranks.h"
#include "cli_process.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "train/train_checkpoint.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using test::slurp;
using test::wait_exit;

const std::string kFixtures = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/";

// Anything a save or an atomic write has in flight: `<name>.tmp.*`, `<name>.old.*` (written independently of
// the names src/train/run_dir.cpp matches, so a sweep that misses one fails here).
std::vector<std::string> in_flight(const fs::path& run) {
  std::vector<std::string> r;
  for (const fs::path& d : {run, run / "data-cache"}) {
    std::error_code ec;
    for (auto it = fs::directory_iterator(d, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (n.find(".tmp") != std::string::npos || n.find(".old.") != std::string::npos) r.push_back(n);
    }
  }
  return r;
}

std::string latest_name(const fs::path& run) {
  std::string s = slurp(run / "latest");
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Every file of a directory, by name.
std::map<std::string, std::string> files_of(const fs::path& d) {
  std::map<std::string, std::string> r;
  for (const auto& e : fs::directory_iterator(d)) r[e.path().filename().string()] = slurp(e.path());
  return r;
}

// The checkpoint `latest` names loads: its state, its optimizer file and the model; every directory named as a
// checkpoint is complete.
void expect_latest_loadable(const fs::path& run) {
  for (const auto& e : fs::directory_iterator(run)) {
    if (train_checkpoint_dir_step(e.path().filename().string()) < 0) continue;
    for (const char* f : {"config.json", "optimizer.safetensors", "trainer_state.json"})
      EXPECT_TRUE(fs::is_regular_file(e.path() / f)) << e.path().filename() << " has no " << f;
  }
  if (!fs::exists(run / "latest")) return;
  try {
    const std::string dir = train_checkpoint_latest(run.string());
    const TrainerState st = train_state_read(dir);
    EXPECT_EQ(fs::path(dir).filename().string(), train_checkpoint_name(st.step));
    SafetensorsFile opt = SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string());
    EXPECT_GT(opt.names().size(), 10u);
    CausalLM::from_pretrained(dir);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "latest (" << latest_name(run) << ") is not loadable: " << e.what();
  }
}

// Same final model and last optimizer state, byte for byte.
void expect_same_bytes(const fs::path& a, const fs::path& b, int64_t last_step) {
  const auto fa = files_of(a / "final"), fb = files_of(b / "final");
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [name, bytes] : fa) EXPECT_TRUE(fb.count(name) && fb.at(name) == bytes) << "final/" << name;
  const std::string ck = train_checkpoint_name(last_step);
  EXPECT_TRUE(slurp(a / ck / "optimizer.safetensors") == slurp(b / ck / "optimizer.safetensors")) << ck;
  // Every step once, with the same loss (a resume drops the records past its checkpoint).
  auto losses = [](const fs::path& run) {
    std::vector<double> r;
    std::ifstream in(run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) r.push_back(nlohmann::json::parse(line).at("loss").get<double>());
    return r;
  };
  EXPECT_EQ(losses(a), losses(b));
  EXPECT_EQ(losses(a).size(), static_cast<size_t>(last_step));
}

// The lines of a log that start "mixtune: error: ".
std::vector<std::string> error_lines(const std::string& log) {
  std::vector<std::string> r;
  size_t at = 0;
  while (at < log.size()) {
    const size_t end = std::min(log.find('\n', at), log.size());
    const std::string line = log.substr(at, end - at);
    if (line.rfind("mixtune: error: ", 0) == 0) r.push_back(line);
    at = end + 1;
  }
  return r;
}

// Names created in (or moved into) a directory, as they happen.
class DirWatch {
 public:
  explicit DirWatch(const fs::path& dir) {
    fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ >= 0) inotify_add_watch(fd_, dir.c_str(), IN_CREATE | IN_MOVED_TO);
  }
  ~DirWatch() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  // The next name, or "" after `timeout_ms` without one.
  std::string next(int timeout_ms) {
    while (pending_.empty()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return "";
      alignas(inotify_event) char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      for (ssize_t at = 0; at < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + at);
        if (ev->len > 0) pending_.emplace_back(ev->name);
        at += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
      }
    }
    std::string s = pending_.front();
    pending_.erase(pending_.begin());
    return s;
  }

 private:
  int fd_ = -1;
  std::vector<std::string> pending_;
};

bool exited(pid_t pid, int* code) {
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) != pid) return false;
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

class CrashCli : public ::testing::Test {
 protected:
  fs::path dir;

  void SetUp() override {
    dir = fs::temp_directory_path() / ("mt_crash_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  // A recipe writing a checkpoint every step into `run` (default: dir/name).
  fs::path recipe(const std::string& name, int64_t max_steps, const fs::path& run = {}, int keep_last = 2) {
    const fs::path p = dir / (name + ".yaml");
    std::ofstream(p) << "model: {path: " << kFixtures << "moe_gqa_aux/ckpt, dtype: float32}\n"
                     << "data: {train: " << kFixtures << "train5/train.jsonl, seq_len: 16}\n"
                     << "train: {max_steps: " << max_steps << ", device: cpu, seed: 7}\n"
                     << "optimizer: {lr: 1.0e-3, weight_decay: 0.01}\n"
                     << "checkpoint: {dir: " << (run.empty() ? dir / name : run).string()
                     << ", every_steps: 1, keep_last: " << keep_last << "}\n"
                     << "parallel: {timeout_s: 30}\n";
    return p;
  }

  int finetune(const fs::path& recipe_path, const std::string& log, std::vector<std::string> extra = {},
               rlim_t file_size_limit = RLIM_INFINITY) {
    std::vector<std::string> args = {"finetune", recipe_path.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return wait_exit(test::spawn_program(test::mixtune_binary(), args, dir / log, {}, {}, file_size_limit));
  }

  // The ranks of a two-rank job, started directly with the torchrun variables (no launcher: the test stops and
  // kills one rank itself).
  std::vector<pid_t> two_ranks(const fs::path& recipe_path, const std::string& log, std::vector<std::string> extra,
                               rlim_t file_size_limit = RLIM_INFINITY) {
    const std::string port = std::to_string(test::free_port());
    std::vector<pid_t> pids;
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<std::string> args = {"finetune", recipe_path.string(), "--set", "parallel.ep=2"};
      args.insert(args.end(), extra.begin(), extra.end());
      pids.push_back(test::spawn_program(
          test::mixtune_binary(), args, dir / (log + std::to_string(rank)),
          {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "LOCAL_RANK",
           "LOCAL_WORLD_SIZE"},
          {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}},
          file_size_limit));
    }
    return pids;
  }
};

// 22 processes killed with SIGKILL at seeded random moments, each resumed by the next. Every third one at a random
// time before about its third step (start-up, the leftover sweep, a step, a save), at the latest when its second
// save starts; the others a random fraction of half a step after the n-th (n = 1..4) temp entry of a save appears
// (the checkpoint's temp directory, or latest.tmp between the commit and the move of `latest`). Times are in
// units of the uninterrupted run's, so each process gets at most about two steps further on any machine (about
// step 20 of 40 in all). After each kill every checkpoint is complete and `latest` loads; then one run finishes
// with the bytes of the uninterrupted run, and nothing is left in flight.
TEST_F(CrashCli, KilledAtRandomMomentsResumesToTheUninterruptedRun) {
  constexpr int kKills = 22;
  constexpr int64_t kSteps = 40;
  const fs::path whole = dir / "whole";
  fs::create_directories(whole);
  double startup_ms = 0, step_ms = 0;  // until the first save starts; per step after it
  {
    DirWatch w(whole);
    ASSERT_TRUE(w.ok());
    const auto t0 = Clock::now();
    const pid_t pid = test::spawn_mixtune({"finetune", recipe("whole", kSteps).string()}, dir / "whole.log");
    int code = -1;
    while (startup_ms == 0 && !exited(pid, &code))
      if (w.next(5).rfind("checkpoint-", 0) == 0) startup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (code < 0) code = wait_exit(pid);
    ASSERT_EQ(code, 0) << slurp(dir / "whole.log");
    step_ms = (std::chrono::duration<double, std::milli>(Clock::now() - t0).count() - startup_ms) / kSteps;
  }
  auto ms = [](double v) { return std::chrono::microseconds(static_cast<int64_t>(v * 1000)); };

  const fs::path p = recipe("killed", kSteps), run = dir / "killed";
  fs::create_directories(run);
  DirWatch watch(run);
  ASSERT_TRUE(watch.ok());
  std::mt19937 rng(20240542);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int kills = 0, with_leftovers = 0, finished_early = 0;
  for (int i = 0; i < kKills; ++i) {
    SCOPED_TRACE("process " + std::to_string(i));
    const bool resume = fs::exists(run / "latest");
    const std::string log = "killed" + std::to_string(i) + ".log";
    const pid_t pid = test::spawn_program(test::mixtune_binary(),
                                          resume ? std::vector<std::string>{"finetune", p.string(), "--resume"}
                                                 : std::vector<std::string>{"finetune", p.string()},
                                          dir / log);
    int code = -1;
    bool done = false;
    if (i % 3 == 0) {
      const auto at = Clock::now() + ms(unit(rng) * (startup_ms + 3 * step_ms));
      int saves = 0;
      while (Clock::now() < at && saves < 2 && !(done = exited(pid, &code))) {
        const std::string name = watch.next(1);
        saves += name.rfind("checkpoint-", 0) == 0 && name.find(".tmp.") != std::string::npos;
      }
    } else {
      int wanted = 1 + static_cast<int>(rng() % 4);
      const auto delay = ms(unit(rng) * step_ms / 2);
      while (wanted > 0 && !(done = exited(pid, &code))) {
        const std::string name = watch.next(20);
        if (name.find(".tmp.") != std::string::npos) --wanted;
      }
      if (!done) std::this_thread::sleep_for(delay);
    }
    if (!done) {
      kill(pid, SIGKILL);
      code = wait_exit(pid);
    }
    while (!watch.next(0).empty()) {
    }
    if (code == 0) {  // it finished before the moment came: start over from its checkpoints
      ++finished_early;
      break;
    }
    ASSERT_EQ(code, 128 + SIGKILL) << slurp(dir / log);
    ++kills;
    with_leftovers += !in_flight(run).empty();
    expect_latest_loadable(run);
  }
  EXPECT_EQ(finished_early, 0) << "raise kSteps: the run ended before the kills did";
  EXPECT_EQ(kills, kKills);
  // The test means something only if kills left things in flight for the next process to sweep.
  EXPECT_GE(with_leftovers, 3);
  std::printf("%d kills, %d of them leaving temp entries; then at %s (start-up %.0f ms, %.1f ms a step)\n", kills,
              with_leftovers, latest_name(run).c_str(), startup_ms, step_ms);
  ASSERT_EQ(finetune(p, "killed_last.log", {"--resume"}), 0) << slurp(dir / "killed_last.log");
  EXPECT_EQ(in_flight(run), std::vector<std::string>{});
  expect_latest_loadable(run);
  expect_same_bytes(dir / "whole", run, kSteps);
}

// A second finetune on a directory in use stops at once with one line naming it and the holder; the first one
// keeps training undisturbed; once the holder is killed, the directory is free again.
TEST_F(CrashCli, ASecondWriterIsRefusedAndADeadOneDoesNotBlock) {
  const fs::path p = recipe("busy", 1000000), run = dir / "busy";
  const pid_t first = test::spawn_mixtune({"finetune", p.string()}, dir / "first.log");
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!fs::exists(run / "latest") && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(run / "latest")) << slurp(dir / "first.log");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  for (const bool resume : {true, false}) {
    // Given 10 s: a second writer that is let in would train on (max_steps 1000000), and is killed.
    const pid_t second = test::spawn_mixtune(
        resume ? std::vector<std::string>{"finetune", p.string(), "--resume"} : std::vector<std::string>{"finetune", p.string()},
        dir / "second.log");
    int code = -1;
    for (const auto until = Clock::now() + std::chrono::seconds(10); !exited(second, &code) && Clock::now() < until;)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (code < 0) {
      kill(second, SIGKILL);
      wait_exit(second);
      ADD_FAILURE() << "the second finetune was let in (resume: " << resume << ")";
    }
    EXPECT_EQ(code, 1);
    const std::string log = slurp(dir / "second.log");
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
    EXPECT_NE(log.find("mixtune: error: checkpoint.dir " + run.string() + " is in use by another mixtune finetune (pid " +
                       std::to_string(first) + " host " + host + ";"),
              std::string::npos)
        << log;
  }
  int code = 0;
  EXPECT_FALSE(exited(first, &code)) << slurp(dir / "first.log");  // undisturbed
  kill(first, SIGKILL);
  EXPECT_EQ(wait_exit(first), 128 + SIGKILL);
  const int64_t step = train_checkpoint_dir_step(latest_name(run));
  ASSERT_GT(step, 0);
  EXPECT_EQ(finetune(p, "third.log", {"--resume", "--set", "train.max_steps=" + std::to_string(step + 1)}), 0)
      << slurp(dir / "third.log");
  EXPECT_EQ(in_flight(run), std::vector<std::string>{});
}

// A save past the file-size limit (ulimit -f): one error line naming the file and the limit, exit 1, no temp
// directory, `latest` and the previous checkpoint untouched; --resume then finishes with the bytes of the
// uninterrupted run.
TEST_F(CrashCli, ASaveOverTheFileSizeLimitFailsCleanly) {
  ASSERT_EQ(finetune(recipe("whole", 4), "whole.log"), 0) << slurp(dir / "whole.log");
  const fs::path p = recipe("limited", 4), run = dir / "limited";
  ASSERT_EQ(finetune(p, "first.log", {"--set", "train.max_steps=2"}), 0) << slurp(dir / "first.log");
  ASSERT_EQ(latest_name(run), "checkpoint-000002");
  const auto before = files_of(run / "checkpoint-000002");
  const rlim_t limit = before.at("optimizer.safetensors").size() / 2;

  EXPECT_EQ(finetune(p, "limited.log", {"--resume"}, limit), 1);
  const std::string log = slurp(dir / "limited.log");
  const auto errors = error_lines(log);
  ASSERT_EQ(errors.size(), 1u) << log;
  for (const std::string& part :
       {std::string("saving checkpoint-000003 (about "), "failed: write to " + (run / "checkpoint-000003.tmp.").string(),
        "more needed): File too large (this process's file-size limit, ulimit -f, is " + std::to_string(limit) +
            " bytes); latest still names checkpoint-000002, where --resume continues"})
    EXPECT_NE(errors[0].find(part), std::string::npos) << "'" << part << "' not in: " << errors[0];
  EXPECT_EQ(in_flight(run), std::vector<std::string>{});
  EXPECT_EQ(latest_name(run), "checkpoint-000002");
  EXPECT_TRUE(files_of(run / "checkpoint-000002") == before);
  EXPECT_FALSE(fs::exists(run / "checkpoint-000003"));

  ASSERT_EQ(finetune(p, "resumed.log", {"--resume"}), 0) << slurp(dir / "resumed.log");
  expect_same_bytes(dir / "whole", run, 4);
}

// A small tmpfs in a mount namespace of its own (a child process holds it; this process reaches it through
// /proc/<child>/root): the save that finds the disk full is warned about before it starts, fails with ENOSPC
// in one line, and leaves the previous checkpoint. Skipped where mount namespaces are not allowed.
class SmallFileSystem {
 public:
  explicit SmallFileSystem(const fs::path& mount_point) {
    fs::create_directories(mount_point);
    int ready[2];
    if (::pipe(ready) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      char ok = 'n';
      if (::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
          ::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=8m") == 0)
        ok = 'y';
      (void)!::write(ready[1], &ok, 1);
      if (ok == 'y') ::pause();
      ::_exit(0);
    }
    ::close(ready[1]);
    char ok = 'n';
    if (::read(ready[0], &ok, 1) == 1 && ok == 'y') path_ = fs::path("/proc/" + std::to_string(pid_) + "/root") / mount_point.relative_path();
    ::close(ready[0]);
  }
  ~SmallFileSystem() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  const fs::path& path() const { return path_; }  // empty when no tmpfs could be mounted

 private:
  pid_t pid_ = -1;
  fs::path path_;
};

TEST_F(CrashCli, ASaveOnAFullDiskFailsCleanly) {
  SmallFileSystem small(dir / "mnt");
  if (small.path().empty()) GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace of its own here";
  ASSERT_EQ(finetune(recipe("whole", 4), "whole.log"), 0) << slurp(dir / "whole.log");
  const fs::path run = small.path() / "run", p = recipe("full", 4, run);
  ASSERT_EQ(finetune(p, "first.log", {"--set", "train.max_steps=2"}), 0) << slurp(dir / "first.log");
  const auto before = files_of(run / "checkpoint-000002");
  uint64_t checkpoint_bytes = 0;
  for (const auto& [name, bytes] : before) checkpoint_bytes += bytes.size();
  // Fill the file system to half a checkpoint's room.
  struct statvfs sv {};
  ASSERT_EQ(statvfs(run.c_str(), &sv), 0);
  const uint64_t avail = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
  ASSERT_GT(avail, checkpoint_bytes);
  {
    std::ofstream filler(small.path() / "filler", std::ios::binary);
    const std::string block(1 << 16, '\0');
    for (uint64_t left = avail - checkpoint_bytes / 2; left > 0;) {
      const uint64_t n = std::min<uint64_t>(left, block.size());
      filler.write(block.data(), static_cast<std::streamsize>(n));
      left -= n;
    }
    ASSERT_TRUE(filler.good());
  }

  EXPECT_EQ(finetune(p, "full.log", {"--resume"}), 1);
  const std::string log = slurp(dir / "full.log");
  EXPECT_NE(log.find("warning: checkpoint-000003 needs about "), std::string::npos) << log;
  const auto errors = error_lines(log);
  ASSERT_EQ(errors.size(), 1u) << log;
  for (const std::string& part : {std::string("saving checkpoint-000003 (about "), std::string("No space left on device ("),
                                  std::string("latest still names checkpoint-000002, where --resume continues")})
    EXPECT_NE(errors[0].find(part), std::string::npos) << "'" << part << "' not in: " << errors[0];
  EXPECT_EQ(in_flight(run), std::vector<std::string>{});
  EXPECT_EQ(latest_name(run), "checkpoint-000002");
  EXPECT_TRUE(files_of(run / "checkpoint-000002") == before);

  fs::remove(small.path() / "filler");
  ASSERT_EQ(finetune(p, "resumed.log", {"--resume"}), 0) << slurp(dir / "resumed.log");
  expect_same_bytes(dir / "whole", run, 4);
}

// Two ranks, experts split between them (each writes its experts' rows of the shared files): rank 1 is stopped
// as rank 0 starts a save and killed while rank 0 waits for its part. Rank 0 fails in one line and removes the
// temp directory; `latest` still names the previous checkpoint, bytewise the uninterrupted job's. A resume under
// the file-size limit fails the same way; a plain resume finishes with the uninterrupted job's bytes.
TEST_F(CrashCli, TwoRanksARankDyingMidSaveLeavesThePreviousCheckpoint) {
  constexpr int64_t kSteps = 4;
  for (pid_t pid : two_ranks(recipe("whole", kSteps, {}, /*keep_last=*/kSteps), "whole.log", {}))
    ASSERT_EQ(wait_exit(pid), 0) << slurp(dir / "whole.log0") << slurp(dir / "whole.log1");

  const fs::path p = recipe("ranks", kSteps), run = dir / "ranks";
  fs::create_directories(run);
  DirWatch watch(run);
  ASSERT_TRUE(watch.ok());
  const std::vector<pid_t> ranks = two_ranks(p, "ranks.log", {});
  std::string killed_in;  // the save's temp directory
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (killed_in.empty() && Clock::now() < deadline) {
    const std::string name = watch.next(50);
    // A save after the first one (so there is a previous checkpoint to keep).
    if (name.rfind("checkpoint-", 0) != 0 || name.find(".tmp.") == std::string::npos || !fs::exists(run / "latest"))
      continue;
    kill(ranks[1], SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (fs::is_directory(run / name)) {  // rank 0 waits for rank 1's part: mid-save
      EXPECT_EQ(slurp(run / "mixtune.lock"), "pid " + std::to_string(ranks[0]) + " host " + [] {
        char h[256] = {};
        gethostname(h, sizeof h - 1);
        return std::string(h);
      }() + "\n");
      kill(ranks[1], SIGKILL);
      killed_in = name;
    } else {
      kill(ranks[1], SIGCONT);
    }
  }
  ASSERT_FALSE(killed_in.empty()) << slurp(dir / "ranks.log0");
  EXPECT_EQ(wait_exit(ranks[1]), 128 + SIGKILL);
  const auto t0 = Clock::now();
  EXPECT_EQ(wait_exit(ranks[0]), 1);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20));
  const std::string saving = killed_in.substr(0, killed_in.find(".tmp."));
  const std::string previous = train_checkpoint_name(train_checkpoint_dir_step(saving) - 1);
  const auto errors = error_lines(slurp(dir / "ranks.log0"));
  ASSERT_EQ(errors.size(), 1u) << slurp(dir / "ranks.log0");
  EXPECT_NE(errors[0].find("saving " + saving + " (about "), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("latest still names " + previous + ", where --resume continues"), std::string::npos)
      << errors[0];
  EXPECT_EQ(in_flight(run), std::vector<std::string>{});
  EXPECT_EQ(latest_name(run), previous);
  expect_latest_loadable(run);
  EXPECT_TRUE(files_of(run / previous) == files_of(dir / "whole" / previous)) << previous;

  // Under a file-size limit below the optimizer file: rank 0 cannot lay the save out; both ranks fail.
  const rlim_t limit = slurp(run / previous / "optimizer.safetensors").size() / 2;
  const std::vector<pid_t> limited = two_ranks(p, "limited.log", {"--resume"}, limit);
  for (pid_t pid : limited) EXPECT_EQ(wait_exit(pid), 1);
  const auto lead_errors = error_lines(slurp(dir / "limited.log0"));
  ASSERT_EQ(lead_errors.size(), 1u) << slurp(dir / "limited.log0");
  EXPECT_NE(lead_errors[0].find("File too large"), std::string::npos) << lead_errors[0];
  EXPECT_EQ(in_flight(run), std::vector<std::string>{});
  EXPECT_EQ(latest_name(run), previous);

  for (pid_t pid : two_ranks(p, "resumed.log", {"--resume"}))
    EXPECT_EQ(wait_exit(pid), 0) << slurp(dir / "resumed.log0") << slurp(dir / "resumed.log1");
  EXPECT_NE(slurp(dir / "resumed.log0").find("resumed from"), std::string::npos);
  expect_same_bytes(dir / "whole", run, kSteps);
}

}  // namespace
}  // namespace mt
