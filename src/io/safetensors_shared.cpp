#include "io/safetensors_shared.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_text.h"
#include "io/safetensors.h"

namespace mt {

namespace {

// Closes on every path out (an error while writing must not leak the descriptor).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pwrite_all(int fd, const char* p, uint64_t bytes, uint64_t at, const std::string& path, const std::string& what) {
  const uint64_t total = bytes;
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail("write to {} ({}) failed at byte {} with {} of its {} bytes still to write: {}", path, what, at, bytes,
           total, write_failure_reason(path, n < 0 ? errno : ENOSPC));
    p += n, at += static_cast<uint64_t>(n), bytes -= static_cast<uint64_t>(n);
  }
}

void sync_and_close(Fd& f, const std::string& path) {
  if (::fsync(f.fd) != 0) fail("fsync of {} failed: {}", path, write_failure_reason(path, errno));
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) fail("close of {} failed: {}", path, write_failure_reason(path, errno));
}

}  // namespace

void safetensors_shared_create(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  const SafetensorsLayout l = safetensors_layout(path, tensors, metadata);
  Fd f;
  f.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) fail("cannot create {}: {}", path, write_failure_reason(path, errno));
  pwrite_all(f.fd, l.prefix.data(), l.prefix.size(), 0, path, "header");
  if (::ftruncate(f.fd, static_cast<off_t>(l.file_bytes)) != 0)
    fail("cannot size {} to {} bytes: {}", path, l.file_bytes, write_failure_reason(path, errno));
  sync_and_close(f, path);
}

void safetensors_shared_write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata, const RowsOf& rows_of) {
  const SafetensorsLayout l = safetensors_layout(path, tensors, metadata);
  Fd f;
  f.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (f.fd < 0) fail("cannot open {} to write this rank's part: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != l.file_bytes)
    fail("{}: found {} bytes, expected {} (was it laid out for the same tensors?)", path,
         static_cast<long long>(st.st_size), l.file_bytes);
  bool wrote = false;
  for (const auto& [name, t] : tensors) {
    const auto [r0, r1] = rows_of(name, t);
    if (r1 <= r0) continue;
    const int64_t rows = t.ndim() == 0 ? 1 : t.dim(0);
    if (r0 < 0 || r1 > rows)
      fail("writing {}: rows [{}, {}) of tensor {} with {} rows", path, r0, r1, json_quote_short(name), rows);
    const uint64_t row_bytes = rows > 0 ? t.nbytes() / static_cast<uint64_t>(rows) : 0;
    pwrite_all(f.fd, static_cast<const char*>(t.data()) + r0 * row_bytes, (r1 - r0) * row_bytes,
               l.offset.at(name) + r0 * row_bytes, path, "tensor " + json_quote_short(name));
    wrote = true;
  }
  if (wrote) sync_and_close(f, path);
}

}  // namespace mt
