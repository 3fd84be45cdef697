// The run directory (checkpoint.dir) of `mixtune finetune` belongs to one writer at a time, and what a killed
// writer left behind is removed before the next one writes. A job of several ranks does both on rank 0 only.
//   lock:      <run_dir>/mixtune.lock, flock'ed for the whole run (io/file_lock.h; it holds "pid P host H")
//   leftovers: temp directories of checkpoint and final saves (io/atomic_dir.h: checkpoint-N.tmp.PID.K,
//              checkpoint-N.old.PID, final.tmp.PID.K, final.old.PID) and temp files of the run's own atomic
//              file writes (io/atomic_file.h: latest.tmp.PID, metrics.jsonl.tmp.PID,
//              data-cache/*.tokens.tmp.PID); nothing else, never a complete checkpoint
//   space:     a checkpoint that will not fit in the free space is said before it is written
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/file_lock.h"

namespace mt {

inline constexpr const char* kRunDirLockFile = "mixtune.lock";

struct RunDirLock {
  FileLock lock;        // held while the run lasts
  std::string warning;  // set when the file system does not do flock: the run goes on unguarded
};

// Takes the run directory's lock for this process, or fails at once with one line naming the run directory and
// the holder's pid and host. (The directory exists.)
RunDirLock run_dir_lock(const std::string& run_dir);

// Whether the entry `name` of the run directory (`is_dir`: a directory, not a link) is a leftover, and for a
// file in data-cache/, `in_cache` set.
bool run_dir_is_leftover(const std::string& name, bool is_dir, bool in_cache = false);

struct RunDirLeftovers {
  std::vector<std::string> removed;      // names relative to the run directory
  uint64_t bytes = 0;                    // disk space they took
  std::vector<std::string> not_removed;  // "name: why"
};

// Removes the leftovers of earlier processes. Only with the lock held (a live writer's temp directory looks
// the same).
RunDirLeftovers run_dir_remove_leftovers(const std::string& run_dir);

// The log line for what run_dir_remove_leftovers did; "" when it found nothing.
std::string run_dir_leftovers_summary(const std::string& run_dir, const RunDirLeftovers& l);

// A warning line when `bytes` (a checkpoint's size) exceed the free space of the run directory's file system,
// else "". `what` names the save ("checkpoint-000006").
std::string run_dir_space_warning(const std::string& run_dir, const std::string& what, uint64_t bytes);

// "1.5 GiB", "12.0 MiB", "512 bytes".
std::string bytes_text(uint64_t bytes);

}  // namespace mt
