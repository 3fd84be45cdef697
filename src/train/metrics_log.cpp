#include "train/metrics_log.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "io/atomic_file.h"

extern char** environ;

namespace fs = std::filesystem;

namespace mt {

MetricsLog::MetricsLog(std::string path, int64_t keep_through_step) : path_(std::move(path)) {
  if (keep_through_step >= 0 && fs::exists(path_)) {
    std::ifstream in(path_, std::ios::binary);
    std::string kept, line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      // A torn last line (killed mid-write) or a record past the checkpoint is dropped.
      if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      if (j["step"].get<int64_t>() <= keep_through_step) kept += line + "\n";
    }
    file_write_atomic(path_, {kept});
  }
  f_ = std::fopen(path_.c_str(), keep_through_step >= 0 ? "ab" : "wb");
  if (!f_) fail("{}: cannot open for writing", path_);
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::append(const nlohmann::ordered_json& record) {
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    fail("{}: write failed", path_);
}

namespace {

// gnuplot single-quoted string: a quote is written twice.
std::string gnuplot_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string loss_plot_write(const std::string& metrics_path, const std::string& png_path) {
  std::ifstream in(metrics_path, std::ios::binary);
  if (!in) return metrics_path + ": cannot open";
  std::string train_tsv, eval_tsv, line;
  int64_t records = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step")) continue;
    if (j.contains("loss") && j["loss"].is_number()) {
      train_tsv += fmt::format("{}\t{}\n", j["step"].dump(), j["loss"].dump());
      ++records;
    }
    if (j.contains("eval_loss") && j["eval_loss"].is_number())
      eval_tsv += fmt::format("{}\t{}\n", j["step"].dump(), j["eval_loss"].dump());
  }
  if (records == 0) return metrics_path + ": no step records to plot";
  const std::string train_path = png_path + ".train.tsv", eval_path = png_path + ".eval.tsv";
  const std::string script_path = png_path + ".gp";
  std::string script = fmt::format(
      "set terminal pngcairo size 900,540\nset output {}\nset xlabel 'optimizer step'\nset ylabel 'loss'\n"
      "set grid\nset key top right\nplot {} using 1:2 with lines lw 2 title 'train loss'",
      gnuplot_quote(png_path + ".tmp"), gnuplot_quote(train_path));
  if (!eval_tsv.empty()) script += fmt::format(", {} using 1:2 with linespoints lw 2 title 'eval loss'", gnuplot_quote(eval_path));
  script += "\n";
  std::string why;
  try {
    file_write_atomic(train_path, {train_tsv});
    if (!eval_tsv.empty()) file_write_atomic(eval_path, {eval_tsv});
    file_write_atomic(script_path, {script});
  } catch (const Error& e) {
    return e.what();
  }
  std::vector<char*> argv = {const_cast<char*>("gnuplot"), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  const int rc = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (rc != 0) {
    why = "gnuplot is not installed (apt-get install gnuplot-nox)";
  } else if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    why = "gnuplot failed on " + script_path;
  } else {
    std::error_code ec;
    fs::rename(png_path + ".tmp", png_path, ec);
    if (ec) why = png_path + ": " + ec.message();
  }
  std::error_code ec;
  for (const auto& p : {train_path, eval_path, script_path, png_path + ".tmp"}) fs::remove(p, ec);
  return why;
}

}  // namespace mt
