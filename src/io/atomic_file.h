// Crash-safe single-file writes: a reader sees the old file or the complete new one, never
// a prefix. Write to a temp sibling, fsync, rename over the target, fsync the directory.
// Every write, fsync and close is checked; a full disk or the file-size limit is said as such.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

// Writes the concatenation of `pieces` to `path` via `path.tmp.<pid>`; on any failure the
// temp file is removed and mt::Error names `path` and the failing call.
void file_write_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

// Writes `pieces` to `path` in place (created or truncated), no fsync: for files inside a
// directory that is fsynced and renamed as a whole (io/atomic_dir.h). Errors as above.
void file_write(const std::string& path, const std::vector<std::string_view>& pieces);

// fsync of a file or directory (directories make renames and creations durable).
void fsync_path(const std::string& path);

// Why a write, fsync or close of `path` failed with `err`: strerror, plus what a full disk
// (the free bytes of the file system) or the file-size limit (ulimit -f) leaves.
std::string write_failure_reason(const std::string& path, int err);

// Bytes an unprivileged process may still write on the file system holding `path` (statvfs
// f_bavail); -1 when it cannot be told.
int64_t fs_available_bytes(const std::string& path);

// The target of a file_write_atomic temp name (`<target>.tmp.<pid>`), or "" when `name` is not one.
std::string atomic_file_temp_target(const std::string& name);

}  // namespace mt
