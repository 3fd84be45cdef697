#include "io/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "core/error.h"

namespace mt {

namespace {

std::string read_note(int fd) {
  std::string s;
  char buf[512];
  for (off_t at = 0; s.size() < 4096;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
    at += n;
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  for (char& c : s)
    if (c == '\n' || c == '\r' || static_cast<unsigned char>(c) < 0x20) c = ' ';  // one line in messages
  return s;
}

}  // namespace

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

FileLock::FileLock(FileLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

FileLockAttempt file_lock_try(const std::string& path, const std::string& note) {
  FileLockAttempt r;
  // O_RDWR without O_TRUNC: the holder's note must survive a failed attempt.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot open the lock file {}: {}", path, std::strerror(errno));
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      r.busy = true;
      // The holder writes its note right after locking: give it a moment before saying it wrote none.
      for (int i = 0; i < 20 && (r.holder = read_note(fd)).empty(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } else if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
      r.unsupported = std::strerror(err);
    } else {
      ::close(fd);
      fail("cannot lock {}: {}", path, std::strerror(err));
    }
    ::close(fd);
    return r;
  }
  r.lock.fd_ = fd;
  r.lock.path_ = path;
  // Best effort: the lock holds without the note; only the next one's message would lack the holder.
  if (::ftruncate(fd, 0) == 0) {
    const std::string line = note + "\n";
    ssize_t n;
    do {
      n = ::pwrite(fd, line.data(), line.size(), 0);
    } while (n < 0 && errno == EINTR);
  }
  return r;
}

}  // namespace mt
