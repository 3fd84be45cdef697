#include "train/run_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "train/train_checkpoint.h"

namespace fs = std::filesystem;

namespace mt {

namespace {

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "unknown";
  return host;
}

// Blocks allocated (a sparse file counts what it holds), links not followed.
uint64_t disk_bytes(const fs::path& p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return 0;
  uint64_t n = static_cast<uint64_t>(st.st_blocks) * 512;
  if (S_ISDIR(st.st_mode)) {
    std::error_code ec;
    for (auto it = fs::directory_iterator(p, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
      n += disk_bytes(it->path());
  }
  return n;
}

void remove_one(const fs::path& run, const std::string& name, bool is_dir, RunDirLeftovers& out) {
  const fs::path p = run / name;
  const uint64_t bytes = disk_bytes(p);
  std::error_code ec;
  if (is_dir)
    fs::remove_all(p, ec);
  else
    fs::remove(p, ec);
  if (ec) {
    out.not_removed.push_back(name + ": " + ec.message());
    return;
  }
  out.removed.push_back(name);
  out.bytes += bytes;
}

}  // namespace

std::string bytes_text(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1ull << 10));
  return fmt::format("{} bytes", b);
}

RunDirLock run_dir_lock(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / kRunDirLockFile).string();
  FileLockAttempt a = file_lock_try(path, fmt::format("pid {} host {}", ::getpid(), host_name()));
  RunDirLock r;
  if (a.busy)
    fail("checkpoint.dir {} is in use by another mixtune finetune ({}; lock file {}); wait for it to end or stop "
         "it, or choose another checkpoint.dir",
         run_dir, a.holder.empty() ? "its pid and host not written yet" : a.holder, path);
  if (!a.unsupported.empty())
    r.warning = fmt::format("warning: cannot lock {} ({}: the file system does not support flock); nothing stops a "
                            "second finetune from writing to {} at the same time",
                            path, a.unsupported, run_dir);
  r.lock = std::move(a.lock);
  return r;
}

bool run_dir_is_leftover(const std::string& name, bool is_dir, bool in_cache) {
  if (in_cache) {
    const std::string target = atomic_file_temp_target(name);
    return !is_dir && target.size() > 7 && target.compare(target.size() - 7, 7, ".tokens") == 0;
  }
  if (is_dir) {
    const std::string target = atomic_dir_temp_target(name);
    return target == "final" || train_checkpoint_dir_step(target) >= 0;
  }
  const std::string target = atomic_file_temp_target(name);
  return target == "latest" || target == "metrics.jsonl";
}

RunDirLeftovers run_dir_remove_leftovers(const std::string& run_dir) {
  RunDirLeftovers out;
  const fs::path run(run_dir);
  auto sweep = [&](const fs::path& dir, const std::string& prefix, bool in_cache) {
    std::error_code ec;
    std::vector<std::pair<std::string, bool>> found;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const fs::file_status st = it->symlink_status();  // a link is never ours
      const bool is_dir = fs::is_directory(st);
      if (!is_dir && !fs::is_regular_file(st)) continue;
      const std::string name = it->path().filename().string();
      if (run_dir_is_leftover(name, is_dir, in_cache)) found.emplace_back(prefix + name, is_dir);
    }
    if (ec && ec != std::errc::no_such_file_or_directory)
      out.not_removed.push_back(fmt::format("{}: cannot list: {}", dir.string(), ec.message()));
    for (const auto& [name, is_dir] : found) remove_one(run, name, is_dir, out);
  };
  sweep(run, "", false);
  sweep(run / "data-cache", "data-cache/", true);
  return out;
}

std::string run_dir_leftovers_summary(const std::string& run_dir, const RunDirLeftovers& l) {
  if (l.removed.empty() && l.not_removed.empty()) return "";
  constexpr size_t kNamed = 6;  // one line: the first few names, then a count
  std::string names;
  for (size_t i = 0; i < l.removed.size() && i < kNamed; ++i) names += (i ? ", " : "") + l.removed[i];
  if (l.removed.size() > kNamed) names += fmt::format(" and {} more", l.removed.size() - kNamed);
  std::string line = l.removed.empty() ? fmt::format("{}: leftovers of an earlier run", run_dir)
                                       : fmt::format("removed the leftovers of an earlier run in {}: {} ({} freed)",
                                                     run_dir, names, bytes_text(l.bytes));
  if (!l.not_removed.empty()) {
    line += fmt::format("; warning: {} could not be removed: {}", l.not_removed.size(), l.not_removed.front());
    if (l.not_removed.size() > 1) line += fmt::format(" and {} more", l.not_removed.size() - 1);
  }
  return line;
}

std::string run_dir_space_warning(const std::string& run_dir, const std::string& what, uint64_t bytes) {
  const int64_t avail = fs_available_bytes(run_dir);
  if (avail < 0 || static_cast<uint64_t>(avail) >= bytes) return "";
  return fmt::format("warning: {} needs about {}, but only {} is free on the file system of {}: the save will fail "
                     "(the previous checkpoint and latest stay as they are); free some space",
                     what, bytes_text(bytes), bytes_text(static_cast<uint64_t>(avail)), run_dir);
}

}  // namespace mt
