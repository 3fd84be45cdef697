#include "io/atomic_dir.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fs = std::filesystem;

namespace mt {

namespace {
std::atomic<int> g_next_tmp{0};

std::string strip_trailing_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 10) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}
}  // namespace

std::string atomic_dir_temp_target(const std::string& name) {
  const std::string_view n(name);
  // <final>.old.<pid>
  if (const size_t at = n.rfind(".old."); at != std::string_view::npos && at > 0 && all_digits(n.substr(at + 5)))
    return name.substr(0, at);
  // <final>.tmp.<pid>.<n>
  const size_t last = n.rfind('.');
  if (last == std::string_view::npos || !all_digits(n.substr(last + 1))) return "";
  const size_t at = n.substr(0, last).rfind(".tmp.");
  if (at == std::string_view::npos || at == 0 || !all_digits(n.substr(at + 5, last - at - 5))) return "";
  return name.substr(0, at);
}

AtomicDirWriter::AtomicDirWriter(const std::string& final_dir) : final_dir_(strip_trailing_slashes(final_dir)) {
  if (final_dir_.empty()) fail("output directory: empty path");
  std::error_code ec;
  fs::path parent = fs::path(final_dir_).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) fail("cannot create the parent directory of {}: {}", final_dir_, ec.message());
  }
  // A stale temp from a crashed process with the same pid is skipped, never reused.
  for (int tries = 0; tries < 1000; ++tries) {
    std::string cand = fmt::format("{}.tmp.{}.{}", final_dir_, ::getpid(), g_next_tmp.fetch_add(1));
    if (fs::create_directory(cand, ec)) {
      tmp_dir_ = cand;
      return;
    }
    if (ec) fail("cannot create temp directory {} for {}: {}", cand, final_dir_, ec.message());
  }
  fail("cannot find a free temp directory name next to {}", final_dir_);
}

AtomicDirWriter::~AtomicDirWriter() {
  if (committed_ || tmp_dir_.empty()) return;
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);  // best effort: a destructor must not throw
}

void AtomicDirWriter::commit() {
  MT_CHECK(!committed_, "commit of {} called twice", final_dir_);
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(tmp_dir_, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file() || it->is_directory()) fsync_path(it->path().string());
  if (ec) fail("cannot list {} before commit: {}", tmp_dir_, ec.message());
  fsync_path(tmp_dir_);

  const std::string old_dir = fmt::format("{}.old.{}", final_dir_, ::getpid());
  bool moved_aside = false;
  if (fs::exists(fs::symlink_status(final_dir_))) {
    fs::remove_all(old_dir, ec);
    fs::rename(final_dir_, old_dir, ec);
    if (ec) fail("cannot move existing {} aside to {}: {}", final_dir_, old_dir, ec.message());
    moved_aside = true;
  }
  fs::rename(tmp_dir_, final_dir_, ec);
  if (ec) {
    std::error_code ec2;
    if (moved_aside) fs::rename(old_dir, final_dir_, ec2);  // put the previous output back
    fail("cannot rename {} to {}: {}", tmp_dir_, final_dir_, ec.message());
  }
  committed_ = true;
  std::string parent = fs::path(final_dir_).parent_path().string();
  fsync_path(parent.empty() ? "." : parent);
  if (moved_aside) {
    fs::remove_all(old_dir, ec);
    if (ec) fail("saved {} but cannot remove the previous version at {}: {}", final_dir_, old_dir, ec.message());
  }
}

}  // namespace mt
