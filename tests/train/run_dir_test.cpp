// train/run_dir: the lock refuses a second writer naming the directory, pid and host; the sweep removes exactly
// the temp names a killed save leaves (and says what it freed), never a complete checkpoint or anything else;
// the space check warns when a checkpoint cannot fit.
#include "train/run_dir.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>
#include <string>

#include "../io/io_test_util.h"
#include "core/error.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using io_test::ScratchDir;
using io_test::write_bytes;

std::set<std::string> entries(const fs::path& p) {
  std::set<std::string> r;
  for (auto& e : fs::recursive_directory_iterator(p)) r.insert(fs::relative(e.path(), p).string());
  return r;
}

TEST(RunDir, LockRefusesASecondWriter) {
  ScratchDir d;
  RunDirLock first = run_dir_lock(d.path.string());
  ASSERT_TRUE(first.lock.held());
  EXPECT_TRUE(first.warning.empty());
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  io_test::expect_error([&] { run_dir_lock(d.path.string()); },
                        {"checkpoint.dir " + d.path.string() + " is in use by another mixtune finetune",
                         "pid " + std::to_string(::getpid()) + " host " + host, "mixtune.lock"});
  first = RunDirLock{};  // released
  EXPECT_TRUE(run_dir_lock(d.path.string()).lock.held());
}

TEST(RunDir, SweepRemovesExactlyTheLeftovers) {
  ScratchDir d;
  const fs::path run = d.path;
  std::mt19937 rng(1);  // bytes no file system compresses away: the freed bytes are counted in blocks
  auto dir_with = [&](const std::string& name, size_t bytes) {
    fs::create_directories(run / name);
    std::string data(bytes, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    write_bytes((run / name / "model.safetensors").string(), data);
  };
  // Leftovers.
  dir_with("checkpoint-000006.tmp.4321.0", 100000);
  dir_with("checkpoint-000009.old.4400", 1000);
  dir_with("final.tmp.4400.3", 1000);
  dir_with("final.old.12", 10);
  write_bytes((run / "latest.tmp.4321").string(), "checkpoint-000006\n");
  write_bytes((run / "metrics.jsonl.tmp.4321").string(), "{}\n");
  fs::create_directories(run / "data-cache");
  write_bytes((run / "data-cache" / "train.0123456789abcdef.tokens.tmp.99").string(), "t");
  const std::set<std::string> leftovers = {"checkpoint-000006.tmp.4321.0", "checkpoint-000009.old.4400",
                                           "final.tmp.4400.3", "final.old.12", "latest.tmp.4321",
                                           "metrics.jsonl.tmp.4321", "data-cache/train.0123456789abcdef.tokens.tmp.99"};
  // Everything else stays, however alike its name.
  dir_with("checkpoint-000003", 100);
  dir_with("checkpoint-000006", 100);
  dir_with("final", 100);
  write_bytes((run / "latest").string(), "checkpoint-000006\n");
  write_bytes((run / "metrics.jsonl").string(), "{}\n");
  write_bytes((run / "data-cache" / "train.0123456789abcdef.tokens").string(), "t");
  write_bytes((run / "data-cache" / "notes.tmp.99").string(), "mine");
  for (const char* keep : {"checkpoint-000006.tmp", "checkpoint-000006.tmp.4321", "checkpoint-000006.tmp.43x1.0",
                           "checkpoint-abc.tmp.1.2", "mycheckpoint-000006.tmp.1.2", "checkpoint-.tmp.1.2",
                           "finals.tmp.1.2", "final.tmp.1", "best.tmp.1.2", "checkpoint-000006.old"})
    dir_with(keep, 10);
  write_bytes((run / "checkpoint-000007.tmp.1.2").string(), "a file, not a directory we made");
  fs::create_directories(run / "latest.tmp.55");  // a directory, not a file we made
  write_bytes((run / "latest.tmp.55.bak").string(), "x");
  write_bytes((run / "notes.txt.tmp.12").string(), "not one of the run's files");
  fs::create_directories(d.path / "elsewhere");
  fs::create_directory_symlink(d.path / "elsewhere", run / "checkpoint-000008.tmp.1.2");  // links are not ours
  write_bytes((run / "checkpoint-000003" / "x.tmp.5").string(), "inside a checkpoint: not looked at");

  const std::set<std::string> before = entries(run);
  const RunDirLeftovers l = run_dir_remove_leftovers(run.string());
  EXPECT_EQ(std::set<std::string>(l.removed.begin(), l.removed.end()), leftovers);
  EXPECT_TRUE(l.not_removed.empty());
  EXPECT_GE(l.bytes, 100000u);
  std::set<std::string> expected;
  for (const std::string& e : before) {
    bool gone = false;
    for (const std::string& left : leftovers) gone = gone || e == left || e.rfind(left + "/", 0) == 0;
    if (!gone) expected.insert(e);
  }
  EXPECT_EQ(entries(run), expected);
  EXPECT_TRUE(fs::exists(d.path / "elsewhere"));

  const std::string line = run_dir_leftovers_summary(run.string(), l);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("removed the leftovers of an earlier run in " + run.string()), std::string::npos) << line;
  EXPECT_NE(line.find("checkpoint-000006.tmp.4321.0"), std::string::npos) << line;
  EXPECT_NE(line.find(" and 1 more ("), std::string::npos) << line;  // 7 removed, 6 named
  EXPECT_NE(line.find(" KiB freed)"), std::string::npos) << line;
  // A second sweep finds nothing and says nothing.
  EXPECT_TRUE(run_dir_remove_leftovers(run.string()).removed.empty());
  EXPECT_EQ(run_dir_leftovers_summary(run.string(), {}), "");
}

TEST(RunDir, SpaceWarning) {
  ScratchDir d;
  EXPECT_EQ(run_dir_space_warning(d.path.string(), "checkpoint-000006", 1000), "");
  const std::string w = run_dir_space_warning(d.path.string(), "checkpoint-000006", uint64_t{1} << 62);
  EXPECT_NE(w.find("warning: checkpoint-000006 needs about 4294967296.0 GiB, but only"), std::string::npos) << w;
  EXPECT_NE(w.find("is free on the file system of " + d.path.string()), std::string::npos) << w;
  EXPECT_EQ(bytes_text(512), "512 bytes");
  EXPECT_EQ(bytes_text(3 << 20), "3.0 MiB");
}

}  // namespace
}  // namespace mt
