#include "io/atomic_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>

#include "io_test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using io_test::listing;
using io_test::read_bytes;
using io_test::ScratchDir;
using io_test::write_bytes;

TEST(AtomicDir, CommitCreatesDirectory) {
  ScratchDir d;
  const std::string final_dir = d.file("out/ckpt-1");  // parent created on demand
  {
    AtomicDirWriter w(final_dir);
    EXPECT_NE(w.path(), final_dir);
    EXPECT_EQ(w.path().rfind(final_dir + ".tmp.", 0), 0u) << w.path();
    EXPECT_FALSE(fs::exists(final_dir));
    write_bytes(w.path() + "/a.txt", "A");
    fs::create_directory(w.path() + "/sub");
    write_bytes(w.path() + "/sub/b.txt", "B");
    w.commit();
  }
  EXPECT_EQ(read_bytes(final_dir + "/a.txt"), "A");
  EXPECT_EQ(read_bytes(final_dir + "/sub/b.txt"), "B");
  EXPECT_EQ(listing(d.file("out")), (std::vector<std::string>{"ckpt-1"}));
}

TEST(AtomicDir, CommitReplacesExistingDirectory) {
  ScratchDir d;
  const std::string final_dir = d.file("ckpt");
  fs::create_directory(final_dir);
  write_bytes(final_dir + "/stale.txt", "old");
  write_bytes(final_dir + "/a.txt", "old");
  {
    AtomicDirWriter w(final_dir + "/");  // a trailing slash names the same directory
    write_bytes(w.path() + "/a.txt", "new");
    w.commit();
  }
  EXPECT_EQ(listing(final_dir), (std::vector<std::string>{"a.txt"}));
  EXPECT_EQ(read_bytes(final_dir + "/a.txt"), "new");
  EXPECT_EQ(listing(d.path), (std::vector<std::string>{"ckpt"}));  // no .tmp or .old left
}

TEST(AtomicDir, FailedSaveLeavesNothingBehind) {
  ScratchDir d;
  const std::string final_dir = d.file("ckpt");
  EXPECT_THROW(
      {
        AtomicDirWriter w(final_dir);
        write_bytes(w.path() + "/model.safetensors", "partial");
        throw std::runtime_error("save failed half way");
      },
      std::runtime_error);
  EXPECT_TRUE(listing(d.path).empty());

  // With an earlier save in place, a failed save keeps it intact.
  fs::create_directory(final_dir);
  write_bytes(final_dir + "/a.txt", "kept");
  try {
    AtomicDirWriter w(final_dir);
    write_bytes(w.path() + "/a.txt", "partial");
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(listing(d.path), (std::vector<std::string>{"ckpt"}));
  EXPECT_EQ(read_bytes(final_dir + "/a.txt"), "kept");
}

TEST(AtomicDir, TwoWritersGetDistinctTempDirs) {
  ScratchDir d;
  AtomicDirWriter a(d.file("x")), b(d.file("x"));
  EXPECT_NE(a.path(), b.path());
  EXPECT_TRUE(fs::is_directory(a.path()));
  EXPECT_TRUE(fs::is_directory(b.path()));
}

}  // namespace
}  // namespace mt
