// All-or-nothing directory output (checkpoint saves): files go into a fresh temp sibling
// directory, and commit() swaps it into place. A save that throws before commit() leaves
// no partial output: the destructor removes the temp directory.
#pragma once
#include <string>

namespace mt {

class AtomicDirWriter {
 public:
  // Creates `<final_dir>.tmp.<pid>.<n>` (and the parent directories of final_dir).
  explicit AtomicDirWriter(const std::string& final_dir);
  ~AtomicDirWriter();
  AtomicDirWriter(const AtomicDirWriter&) = delete;
  AtomicDirWriter& operator=(const AtomicDirWriter&) = delete;

  const std::string& path() const { return tmp_dir_; }  // write files here
  // fsyncs every file below path() and the directory, then replaces final_dir: an existing
  // one is renamed aside to `<final_dir>.old.<pid>`, the temp renamed into place, the old removed.
  void commit();

 private:
  std::string final_dir_;
  std::string tmp_dir_;
  bool committed_ = false;
};

// The final directory name of a name AtomicDirWriter makes next to it (`<final>.tmp.<pid>.<n>` while
// writing, `<final>.old.<pid>` while committing over an existing one), or "" when `name` is not one.
// A process killed mid-save leaves these behind; only the process that owns the directory may remove them.
std::string atomic_dir_temp_target(const std::string& name);

}  // namespace mt
