// Crash-safe single-file writes: a reader sees the old file or the complete new one, never
// a prefix. Write to a temp sibling, fsync, rename over the target, fsync the directory.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace mt {

// Writes the concatenation of `pieces` to `path` via `path.tmp.<pid>`; on any failure the
// temp file is removed and mt::Error names `path` and the failing call.
void file_write_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

// fsync of a file or directory (directories make renames and creations durable).
void fsync_path(const std::string& path);

}  // namespace mt
