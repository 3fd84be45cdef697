// Shared by the trainer tests: FinetuneOptions that log into a temporary file (quiet, no progress bar), a run's
// metrics.jsonl; test::slurp (cli_process.h) reads a file's bytes.
#pragma once
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../cli/cli_process.h"  // test::slurp
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

// One JSON object per non-empty line of RUN/metrics.jsonl.
inline std::vector<nlohmann::json> metrics_of(const std::filesystem::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace mt::test
