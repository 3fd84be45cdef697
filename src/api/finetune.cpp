// mixtune::finetune: the recipe-driven training loop (train/trainer.h) behind the library's types.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "api/api_error.h"
#include "mixtune/mixtune.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace mixtune {

namespace {

double number_or_nan(const nlohmann::ordered_json& rec, const char* key) {
  const auto it = rec.find(key);
  return it != rec.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
}

StepMetrics step_metrics_of(const nlohmann::ordered_json& rec) {
  StepMetrics m;
  m.step = rec.value("step", int64_t{0});
  m.loss = number_or_nan(rec, "loss");
  m.lr = number_or_nan(rec, "lr");
  m.grad_norm = number_or_nan(rec, "grad_norm");
  m.tokens_per_s = number_or_nan(rec, "tokens_per_s");
  if (rec.contains("eval_loss") && rec["eval_loss"].is_number()) m.eval_loss = rec["eval_loss"].get<double>();
  m.json = rec.dump();
  return m;
}

// stderr, or nothing (quiet): the progress reporter writes to a FILE*.
struct LogSink {
  std::FILE* f = stderr;
  bool owned = false;
  explicit LogSink(bool quiet) {
    if (quiet) {
      f = std::fopen("/dev/null", "w");
      owned = f != nullptr;
      if (!f) f = stderr;
    }
  }
  ~LogSink() {
    if (owned) std::fclose(f);
  }
};

}  // namespace

FinetuneResult finetune(const std::string& recipe_path, const FinetuneOptions& options) {
  return detail::api_call([&] {
    std::vector<std::string> sets = options.set;
    if (!options.adapter.empty()) sets.push_back("model.adapter=" + options.adapter);
    const mt::Recipe recipe = mt::recipe_load(recipe_path, sets);
    LogSink log(options.quiet);
    mt::FinetuneOptions o;
    o.resume = options.resume;
    o.log = log.f;
    if (options.quiet) o.progress_tty = 0;
    o.stop_requested = options.stop_requested;
    o.steps_begin = options.on_steps_begin;
    if (options.on_step) o.on_metrics = [&](const nlohmann::ordered_json& rec) { options.on_step(step_metrics_of(rec)); };
    const mt::FinetuneResult r = mt::finetune(recipe, o);
    FinetuneResult out;
    out.steps = r.steps;
    out.interrupted = r.interrupted;
    out.last_loss = r.last_loss;
    out.final_dir = r.final_dir;
    out.last_checkpoint = r.last_checkpoint;
    out.metrics_path = (std::filesystem::path(recipe.checkpoint.dir) / "metrics.jsonl").string();
    return out;
  });
}

}  // namespace mixtune
