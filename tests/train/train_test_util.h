// Shared by the trainer tests: FinetuneOptions that log into a temporary file (quiet, no progress bar).
#pragma once
#include <cstdio>

#include "train/trainer.h"

namespace mt::test {

struct QuietLog {
  std::FILE* f = std::tmpfile();
  ~QuietLog() { std::fclose(f); }
  FinetuneOptions options(bool resume = false) const {
    FinetuneOptions o;
    o.log = f;
    o.progress_tty = 0;
    o.resume = resume;
    return o;
  }
};

}  // namespace mt::test
