// metrics.jsonl (one JSON object per optimizer step, flushed as written) and the loss-curve PNG drawn
// from it with gnuplot at the end of a run.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace mt {

class MetricsLog {
 public:
  // keep_through_step < 0: start a new file. Otherwise (a resume) keep the records with
  // step <= keep_through_step and drop the later ones an interrupted run wrote after its checkpoint.
  MetricsLog(std::string path, int64_t keep_through_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void append(const nlohmann::ordered_json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Draws loss (and eval_loss where present) against step from a metrics.jsonl into `png_path` with
// gnuplot. Returns "" on success, else why not (gnuplot missing, no records...), for a warning: a
// missing plot never fails a training run.
std::string loss_plot_write(const std::string& metrics_path, const std::string& png_path);

}  // namespace mt
