// mixtune finetune RECIPE.yaml [--set key.path=value ...] [--resume]
// Built on the library API (mixtune::finetune). SIGINT / SIGTERM once training steps run: finish the current optimizer step, write a checkpoint, exit with
// 130 / 143. A second signal kills the process at once (the default action is restored by the first). During
// set-up (rendezvous, loading) there is nothing to checkpoint: the first signal ends the process at once.
#include <csignal>
#include <cstdlib>

#include <fmt/format.h>

#include "cli/commands.h"
#include "mixtune/mixtune.h"

namespace mt::cli {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_steps_running = 0;  // set by FinetuneOptions::on_steps_begin

extern "C" void on_stop_signal(int sig) {
  std::signal(sig, SIG_DFL);
  if (!g_steps_running) {  // still setting up: die by the signal, as without a handler
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

struct FinetuneArgs {
  std::string recipe;
  std::vector<std::string> sets;
  std::string adapter;
  bool resume = false;
};

void run_finetune(const FinetuneArgs& a) {
  mixtune::FinetuneOptions o;
  o.set = a.sets;
  o.adapter = a.adapter;  // as --set model.adapter=DIR
  o.resume = a.resume;
  o.stop_requested = [] { return g_stop_signal != 0; };
  o.on_steps_begin = [] { g_steps_running = 1; };
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const mixtune::FinetuneResult r = mixtune::finetune(a.recipe, o);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (r.interrupted) {
    std::fflush(stdout);
    std::exit(128 + static_cast<int>(g_stop_signal));
  }
}

}  // namespace

void add_finetune_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("finetune", "Fine-tune a model as a YAML recipe says (docs: README, Recipes)");
  static FinetuneArgs a;
  cmd->add_option("RECIPE", a.recipe, "recipe YAML file")->required();
  cmd->add_option("--set", a.sets, "override a recipe key: section.key=value (YAML value), repeatable");
  cmd->add_flag("--resume", a.resume, "continue from <checkpoint.dir>/latest");
  cmd->add_option("--adapter", a.adapter, "continue training this LoRA adapter (PEFT format; = --set model.adapter=DIR)");
  cmd->callback([] { run_finetune(a); });
}

}  // namespace mt::cli
