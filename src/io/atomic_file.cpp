#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"

namespace mt {

namespace {

std::string parent_dir(const std::string& path) {
  std::string p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

// Closes the descriptor and unlinks the temp file unless released.
struct TempFile {
  std::string path;
  int fd = -1;
  bool keep = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!keep) ::unlink(path.c_str());
  }
};

uint64_t total_bytes(const std::vector<std::string_view>& pieces) {
  uint64_t n = 0;
  for (std::string_view p : pieces) n += p.size();
  return n;
}

// `what` names the file for the messages (the target, not its temp name).
void write_pieces(int fd, const std::string& what, const std::vector<std::string_view>& pieces) {
  const uint64_t total = total_bytes(pieces);
  uint64_t done = 0;
  for (std::string_view piece : pieces) {
    const char* p = piece.data();
    size_t left = piece.size();
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;  // a write that makes no progress: the device is full
        fail("write to {} failed after {} of {} bytes ({} more needed): {}", what, done, total, total - done,
             write_failure_reason(what, err));
      }
      p += n;
      left -= static_cast<size_t>(n);
      done += static_cast<uint64_t>(n);
    }
  }
}

bool all_digits(std::string_view s, size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

std::string write_failure_reason(const std::string& path, int err) {
  std::string why = std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) {
    const int64_t avail = fs_available_bytes(parent_dir(path));
    if (avail >= 0) why += fmt::format(" ({} bytes free on its file system)", avail);
  } else if (err == EFBIG) {
    struct rlimit lim {};
    if (::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
      why += fmt::format(" (this process's file-size limit, ulimit -f, is {} bytes)", lim.rlim_cur);
  }
  return why;
}

int64_t fs_available_bytes(const std::string& path) {
  struct statvfs s {};
  if (::statvfs(path.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

std::string atomic_file_temp_target(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0) return "";
  return all_digits(std::string_view(name).substr(at + 5), 10) ? name.substr(0, at) : "";
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {} to fsync: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); nothing more can be done there.
  if (rc != 0 && err != EINVAL) fail("fsync of {} failed: {}", path, write_failure_reason(path, err));
}

void file_write(const std::string& path, const std::vector<std::string_view>& pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create {}: {}", path, write_failure_reason(path, errno));
  try {
    write_pieces(fd, path, pieces);
  } catch (...) {
    ::close(fd);
    throw;
  }
  // NFS and some others report a failed write-back only here.
  if (::close(fd) != 0) fail("close of {} failed: {}", path, write_failure_reason(path, errno));
}

void file_write_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  TempFile tmp;
  tmp.path = path + ".tmp." + std::to_string(::getpid());
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0) {
    tmp.keep = true;  // we did not create it
    fail("cannot create {} (writing {}): {}", tmp.path, path, write_failure_reason(tmp.path, errno));
  }
  write_pieces(tmp.fd, path, pieces);
  if (::fsync(tmp.fd) != 0) fail("fsync of {} failed: {}", tmp.path, write_failure_reason(tmp.path, errno));
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) fail("close of {} failed: {}", tmp.path, write_failure_reason(tmp.path, errno));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    fail("cannot rename {} to {}: {}", tmp.path, path, std::strerror(errno));
  tmp.keep = true;
  fsync_path(parent_dir(path));
}

}  // namespace mt
