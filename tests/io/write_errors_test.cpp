// Write errors are errors, said in one line: a full disk (ENOSPC from /dev/full) and the file-size limit (EFBIG
// under setrlimit in a child process) name the file, how much was left to write and what the limit or free
// space is; an atomic write leaves its target as it was and no temp file; an atomic directory's failed save
// leaves no temp directory. And the temp names these writers make are recognised exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/safetensors_shared.h"
#include "io_test_util.h"
#include "limited_child.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using io_test::listing;
using io_test::read_bytes;
using io_test::run_with_file_size_limit;
using io_test::ScratchDir;
using io_test::write_bytes;

void expect_one_line_with(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(WriteErrors, FullDiskIsNamed) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string data(10000, 'x');
  io_test::expect_error([&] { file_write("/dev/full", {data}); },
                        {"write to /dev/full failed after 0 of 10000 bytes (10000 more needed)",
                         "No space left on device"});
}

TEST(WriteErrors, FileSizeLimitFailsAnAtomicWriteAndKeepsTheTarget) {
  ScratchDir d;
  const std::string target = d.file("latest");
  write_bytes(target, "checkpoint-000003\n");
  const std::string big(100000, 'y');
  const auto r = run_with_file_size_limit(4096, [&] { file_write_atomic(target, {big.substr(0, 50000), big}); });
  ASSERT_TRUE(r.exited) << "killed by SIGXFSZ?";
  ASSERT_TRUE(r.threw);
  expect_one_line_with(r.error, {"write to " + target + " failed after 4096 of 150000 bytes (145904 more needed)",
                                 "File too large", "file-size limit, ulimit -f, is 4096 bytes"});
  EXPECT_EQ(read_bytes(target), "checkpoint-000003\n");
  EXPECT_EQ(listing(d.path), std::vector<std::string>{"latest"});  // no latest.tmp.<pid>
}

TEST(WriteErrors, FileSizeLimitFailsASharedSafetensorsFile) {
  ScratchDir d;
  std::vector<float> v(4096, 1.5f);
  const std::vector<std::pair<std::string, Tensor>> tensors = {{"a", Tensor::from_floats({4096}, v)},
                                                               {"b", Tensor::from_floats({4096}, v)}};
  const std::string path = d.file("model.safetensors");
  // Laid out (sized) past the limit: ftruncate fails.
  auto r = run_with_file_size_limit(20000, [&] { safetensors_shared_create(path, tensors, {}); });
  ASSERT_TRUE(r.exited && r.threw) << r.error;
  expect_one_line_with(r.error, {"cannot size " + path, "File too large", "is 20000 bytes"});
  // Laid out without a limit, then a rank's rows written under one.
  safetensors_shared_create(path, tensors, {});
  r = run_with_file_size_limit(20000, [&] {
    safetensors_shared_write(path, tensors, {}, [](const std::string&, const Tensor& t) {
      return std::pair<int64_t, int64_t>{0, t.dim(0)};
    });
  });
  ASSERT_TRUE(r.exited && r.threw) << r.error;
  expect_one_line_with(r.error, {"write to " + path + " (tensor \"b\") failed at byte", "of its 16384 bytes still to write",
                                 "File too large"});
}

TEST(WriteErrors, AFailedDirectorySaveRemovesItsTempDirectory) {
  ScratchDir d;
  const std::string final_dir = d.file("checkpoint-000006");
  fs::create_directory(d.file("checkpoint-000003"));
  write_bytes(d.file("checkpoint-000003/optimizer.safetensors"), "kept");
  std::vector<float> v(1 << 16, 0.25f);
  const auto r = run_with_file_size_limit(65536, [&] {
    AtomicDirWriter out(final_dir);
    safetensors_write(out.path() + "/optimizer.safetensors", {{"m", Tensor::from_floats({1 << 16}, v)}});
    out.commit();
  });
  ASSERT_TRUE(r.exited && r.threw) << r.error;
  expect_one_line_with(r.error, {"/optimizer.safetensors failed after 65536 of", "File too large"});
  EXPECT_EQ(listing(d.path), std::vector<std::string>{"checkpoint-000003"});
  EXPECT_EQ(read_bytes(d.file("checkpoint-000003/optimizer.safetensors")), "kept");
}

TEST(WriteErrors, TempNamesAreRecognisedExactly) {
  EXPECT_EQ(atomic_dir_temp_target("checkpoint-000006.tmp.4321.0"), "checkpoint-000006");
  EXPECT_EQ(atomic_dir_temp_target("final.tmp.1.12"), "final");
  EXPECT_EQ(atomic_dir_temp_target("checkpoint-000006.old.4321"), "checkpoint-000006");
  for (const char* not_temp : {"checkpoint-000006", "checkpoint-000006.tmp", "checkpoint-000006.tmp.4321",
                               "checkpoint-000006.tmp.43x1.0", "checkpoint-000006.tmp.4321.", ".tmp.1.2",
                               "checkpoint-000006.old.", "checkpoint-000006.old.12.3", "checkpoint-000006.tmp..0",
                               "checkpoint-000006.tmp.12345678901.0"})
    EXPECT_EQ(atomic_dir_temp_target(not_temp), "") << not_temp;
  EXPECT_EQ(atomic_file_temp_target("latest.tmp.4321"), "latest");
  EXPECT_EQ(atomic_file_temp_target("metrics.jsonl.tmp.7"), "metrics.jsonl");
  for (const char* not_temp : {"latest", "latest.tmp", "latest.tmp.", "latest.tmp.12a", ".tmp.12", "latest.tmp.1.2"})
    EXPECT_EQ(atomic_file_temp_target(not_temp), "") << not_temp;
  // The names the writers make are the names recognised.
  ScratchDir d;
  {
    AtomicDirWriter w(d.file("checkpoint-000001"));
    EXPECT_EQ(atomic_dir_temp_target(fs::path(w.path()).filename().string()), "checkpoint-000001");
  }
}

}  // namespace
}  // namespace mt
