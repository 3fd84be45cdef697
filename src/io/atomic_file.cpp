#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

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

}  // namespace

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {} to fsync: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); nothing more can be done there.
  if (rc != 0 && err != EINVAL) fail("fsync of {} failed: {}", path, std::strerror(err));
}

void file_write_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  TempFile tmp;
  tmp.path = path + ".tmp." + std::to_string(::getpid());
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0) {
    tmp.keep = true;  // we did not create it
    fail("cannot create {} (writing {}): {}", tmp.path, path, std::strerror(errno));
  }
  for (std::string_view piece : pieces) {
    const char* p = piece.data();
    size_t left = piece.size();
    while (left > 0) {
      ssize_t n = ::write(tmp.fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write to {} failed: {}", tmp.path, n < 0 ? std::strerror(errno) : "no progress");
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  if (::fsync(tmp.fd) != 0) fail("fsync of {} failed: {}", tmp.path, std::strerror(errno));
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) fail("close of {} failed: {}", tmp.path, std::strerror(errno));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    fail("cannot rename {} to {}: {}", tmp.path, path, std::strerror(errno));
  tmp.keep = true;
  fsync_path(parent_dir(path));
}

}  // namespace mt
