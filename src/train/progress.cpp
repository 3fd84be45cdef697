#include "train/progress.h"

#include <cmath>

#include <fmt/format.h>

namespace mt {

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{:02d}:{:02d}", s / 60, s % 60);
}

void ProgressReporter::step(const StepReport& r) {
  const double eta = r.seconds_per_step * static_cast<double>(r.total_steps - r.step);
  const std::string skipped = r.skipped ? " (skipped: non-finite)" : "";
  const std::string load = r.expert_load > 0 ? fmt::format(" | load max/mean {:.2f}", r.expert_load) : "";
  if (tty_) {
    const int width = 24;
    const double frac = r.total_steps > 0 ? static_cast<double>(r.step) / static_cast<double>(r.total_steps) : 0;
    const int fill = static_cast<int>(frac * width);
    std::string bar = std::string(static_cast<size_t>(fill), '#') + std::string(static_cast<size_t>(width - fill), '.');
    fmt::print(out_, "\r\033[K[{}] step {}/{} | loss {:.4f}{} | lr {:.2e} | {:.0f} tok/s | ETA {}{}", bar, r.step,
               r.total_steps, r.loss, load, r.lr, r.tokens_per_s, format_duration(eta), skipped);
    std::fflush(out_);
    status_shown_ = true;
    return;
  }
  if (r.step % log_every_ != 0 && r.step != r.total_steps && !r.skipped) return;
  fmt::print(out_, "step {}/{} loss {:.4f} grad_norm {:.4f}{} lr {:.3e} tokens/s {:.0f} eta {}{}\n", r.step,
             r.total_steps, r.loss, r.grad_norm,
             r.expert_load > 0 ? fmt::format(" load_max/mean {:.2f}", r.expert_load) : std::string(), r.lr,
             r.tokens_per_s, format_duration(eta), skipped);
  std::fflush(out_);
}

void ProgressReporter::message(const std::string& line) {
  if (tty_ && status_shown_) fmt::print(out_, "\r\033[K");
  fmt::print(out_, "{}\n", line);
  std::fflush(out_);
  status_shown_ = false;
}

void ProgressReporter::finish() {
  if (tty_ && status_shown_) fmt::print(out_, "\n");
  std::fflush(out_);
  status_shown_ = false;
}

}  // namespace mt
