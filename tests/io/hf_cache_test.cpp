#include "io/hf_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "io_test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using io_test::expect_error;
using io_test::ScratchDir;
using io_test::write_bytes;

// Sets the cache-related environment for one test and restores it afterwards.
struct CacheEnv {
  static constexpr const char* kVars[] = {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::optional<std::string>> saved;
  CacheEnv() {
    for (const char* v : kVars) {
      const char* s = std::getenv(v);
      saved.push_back(s ? std::optional<std::string>(s) : std::nullopt);
      ::unsetenv(v);
    }
  }
  ~CacheEnv() {
    for (size_t i = 0; i < saved.size(); ++i) {
      if (saved[i])
        ::setenv(kVars[i], saved[i]->c_str(), 1);
      else
        ::unsetenv(kVars[i]);
    }
  }
  void set(const char* var, const std::string& value) { ::setenv(var, value.c_str(), 1); }
};

// Creates hub/models--Org--Name/snapshots/<hash>/config.json under `hub`.
std::string make_snapshot(const std::string& hub, const std::string& repo_dir, const std::string& hash) {
  const std::string snap = hub + "/" + repo_dir + "/snapshots/" + hash;
  fs::create_directories(snap);
  write_bytes(snap + "/config.json", "{}");
  return snap;
}

TEST(HfCache, ExistingDirectoryIsReturnedAsIs) {
  CacheEnv env;
  ScratchDir d;
  EXPECT_EQ(hf_resolve_model_path(d.path.string()), d.path.string());
  write_bytes(d.file("file"), "x");
  expect_error([&] { hf_resolve_model_path(d.file("file")); }, {d.file("file"), "not a directory"});
}

TEST(HfCache, RefsMainPicksTheSnapshot) {
  CacheEnv env;
  ScratchDir d;
  const std::string hub = d.file("hub");
  env.set("HF_HUB_CACHE", hub);
  make_snapshot(hub, "models--Qwen--Qwen3-0.6B", "1111");
  const std::string want = make_snapshot(hub, "models--Qwen--Qwen3-0.6B", "2222");
  fs::create_directories(hub + "/models--Qwen--Qwen3-0.6B/refs");
  write_bytes(hub + "/models--Qwen--Qwen3-0.6B/refs/main", "2222\n");
  EXPECT_EQ(hf_resolve_model_path("Qwen/Qwen3-0.6B"), want);
  // refs/main naming a snapshot that is not there
  write_bytes(hub + "/models--Qwen--Qwen3-0.6B/refs/main", "3333");
  expect_error([&] { hf_resolve_model_path("Qwen/Qwen3-0.6B"); }, {"refs/main", "3333", "missing"});
  write_bytes(hub + "/models--Qwen--Qwen3-0.6B/refs/main", "../../x");
  expect_error([&] { hf_resolve_model_path("Qwen/Qwen3-0.6B"); }, {"refs/main", "not a snapshot hash"});
}

TEST(HfCache, SingleSnapshotWithoutRefs) {
  CacheEnv env;
  ScratchDir d;
  env.set("HF_HUB_CACHE", d.file("hub"));
  const std::string only = make_snapshot(d.file("hub"), "models--Org--Name", "abc");
  EXPECT_EQ(hf_resolve_model_path("Org/Name"), only);
  make_snapshot(d.file("hub"), "models--Org--Name", "def");
  expect_error([&] { hf_resolve_model_path("Org/Name"); }, {"2 snapshots", "expected exactly one"});
}

TEST(HfCache, EnvironmentPrecedence) {
  CacheEnv env;
  ScratchDir d;
  const std::string a = make_snapshot(d.file("xdg/huggingface/hub"), "models--O--N", "x");
  const std::string b = make_snapshot(d.file("home/.cache/huggingface/hub"), "models--O--N", "h");
  const std::string c = make_snapshot(d.file("hfhome/hub"), "models--O--N", "y");
  const std::string e = make_snapshot(d.file("hubcache"), "models--O--N", "z");
  env.set("HOME", d.file("home"));
  EXPECT_EQ(hf_resolve_model_path("O/N"), b);
  env.set("XDG_CACHE_HOME", d.file("xdg"));
  EXPECT_EQ(hf_resolve_model_path("O/N"), a);
  env.set("HF_HOME", d.file("hfhome"));
  EXPECT_EQ(hf_resolve_model_path("O/N"), c);
  env.set("HF_HUB_CACHE", d.file("hubcache"));
  EXPECT_EQ(hf_resolve_model_path("O/N"), e);
}

TEST(HfCache, ErrorsListWhereItLooked) {
  CacheEnv env;
  ScratchDir d;
  env.set("HF_HUB_CACHE", d.file("hub"));
  expect_error([&] { hf_resolve_model_path("Org/Missing"); },
               {"Org/Missing", d.file("hub") + "/models--Org--Missing", "./Org/Missing"});
  for (const char* bad : {"a/b/c", "/abs/path", "./rel", "../up/x", "noslash", "Org/", "Org/.."})
    expect_error([&] { hf_resolve_model_path(bad); }, {bad, "no such directory"});
}

}  // namespace
}  // namespace mt
