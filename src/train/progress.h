// Training progress on stderr: a single self-rewriting status line on a terminal, plain lines
// every log_every steps otherwise (logs, CI). Messages (warnings, eval results) go on their own lines.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mt {

struct StepReport {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, tokens_per_s = 0, grad_norm = 0;
  double seconds_per_step = 0;  // recent average, for the ETA
  double expert_load = 0;       // routed experts' max/mean load (EngineStep); 0: no routed experts, not shown
  bool skipped = false;
};

class ProgressReporter {
 public:
  ProgressReporter(std::FILE* out, bool tty, int64_t log_every) : out_(out), tty_(tty), log_every_(log_every) {}
  void step(const StepReport& r);
  void message(const std::string& line);  // a full line, kept above the status line
  void finish();                          // ends the status line

 private:
  std::FILE* out_;
  bool tty_;
  int64_t log_every_;
  bool status_shown_ = false;
};

// "1:02:03" / "02:03"
std::string format_duration(double seconds);

}  // namespace mt
