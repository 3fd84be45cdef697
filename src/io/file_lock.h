// An advisory, exclusive lock on a file (flock): one holder at a time among processes that ask for it, on this
// host or (through NFS's lock emulation) across hosts. The kernel drops it when its holder dies, so a crashed
// holder never blocks the next. The descriptor is close-on-exec: programs the holder starts do not inherit
// (and outlive it with) the lock. The file is never removed: unlinking a lock file others may have open
// would let two processes lock two different files of the same name.
#pragma once
#include <string>

namespace mt {

struct FileLockAttempt;
FileLockAttempt file_lock_try(const std::string& path, const std::string& note);

class FileLock {
 public:
  FileLock() = default;
  ~FileLock();  // releases (closing the descriptor drops the flock)
  FileLock(FileLock&& o) noexcept;
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  friend FileLockAttempt file_lock_try(const std::string& path, const std::string& note);
  int fd_ = -1;
  std::string path_;
};

struct FileLockAttempt {
  FileLock lock;            // held on success
  bool busy = false;        // another open file (process) holds it
  std::string holder;       // then: the note its holder wrote ("" if it has not written one yet)
  std::string unsupported;  // the file system does not do flock (e.g. Lustre without -o flock): why
};

// Creates `path` if missing (0644) and tries once to lock it, without waiting. On success the file's content
// becomes `note` (who holds it, for the next one's message). A file that cannot be created or opened is an
// mt::Error naming it.
FileLockAttempt file_lock_try(const std::string& path, const std::string& note);

}  // namespace mt
