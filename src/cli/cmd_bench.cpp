// mixtune bench: timed training steps on the GPU, printed as one JSON object (train/cuda/bench_run.h).
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/error.h"
#include "io/atomic_file.h"
#ifdef MIXTUNE_WITH_CUDA
#include "train/cuda/bench_run.h"
#endif

namespace mt::cli {

namespace {
struct BenchArgs {
  std::string preset = "qwen3-30b-a3b", model, precision = "bf16", recompute = "none", device = "cuda:0", json_out;
  int64_t layers = 0, seq = 4096, micro_batch = 1, grad_accum = 8, steps = 5, warmup = 2, ep = 1;
  bool force = false, no_pair_expert_wgrad = false;
};

void run_bench(const BenchArgs& a, const std::string& command) {
#ifdef MIXTUNE_WITH_CUDA
  BenchOptions o;
  o.preset = a.preset;
  o.model_dir = a.model;
  o.layers = a.layers;
  o.seq = a.seq;
  o.micro_batch = a.micro_batch;
  o.grad_accum = a.grad_accum;
  o.steps = a.steps;
  o.warmup = a.warmup;
  o.precision = a.precision;
  o.recompute = recompute_parse(a.recompute, "--recompute");
  o.force = a.force;
  o.no_pair_expert_wgrad = a.no_pair_expert_wgrad;
  o.command = command;
  o.ep = a.ep;
  if (a.device == "cuda")
    o.device = 0;
  else if (a.device.rfind("cuda:", 0) == 0 && a.device.size() > 5 &&
           a.device.find_first_not_of("0123456789", 5) == std::string::npos)
    o.device = std::stoi(a.device.substr(5));
  else
    fail("--device: expected cuda or cuda:N, found '{}'", a.device);
  const nlohmann::ordered_json j = bench_run(o, stderr);
  if (j.empty()) return;  // a rank other than 0 of a multi-GPU bench
  const std::string text = j.dump(2) + "\n";
  std::fputs(text.c_str(), stdout);
  if (!a.json_out.empty()) file_write_atomic(a.json_out, {text});
#else
  (void)a;
  (void)command;
  fail("bench: this build of mixtune has no CUDA support (configure with -DMIXTUNE_CUDA=ON on a machine with nvcc)");
#endif
}
}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Timed training steps on the GPU (tokens/s, TFLOP/s, MFU, memory), as JSON");
  static BenchArgs a;
  cmd->add_option("--preset", a.preset, "model shapes: qwen3-30b-a3b | qwen3-moe-tiny | qwen3-moe-test");
  cmd->add_option("--model", a.model, "take the config and weights from this checkpoint instead of a preset");
  cmd->add_option("--layers", a.layers, "slice the model to this many layers (0: all)");
  cmd->add_option("--seq", a.seq, "tokens per sequence");
  cmd->add_option("--micro-batch", a.micro_batch, "sequences per micro-batch");
  cmd->add_option("--grad-accum", a.grad_accum, "micro-batches per optimizer step");
  cmd->add_option("--steps", a.steps, "timed optimizer steps");
  cmd->add_option("--warmup", a.warmup, "untimed optimizer steps first");
  cmd->add_option("--precision", a.precision,
                  "bf16 (bf16 params + bf16 AdamW moments) | fp32-master (fp32 master weights + fp32 moments)");
  cmd->add_option("--recompute", a.recompute, "activation recompute: none | selective | full");
  cmd->add_option("--device", a.device, "cuda or cuda:N (one process; ranks of `mixtune launch` use LOCAL_RANK)");
  cmd->add_option("--ep", a.ep, "expert-parallel ranks (under mixtune launch --nproc N: experts split over groups of this many)");
  cmd->add_option("--json-out", a.json_out, "also write the JSON to this file");
  cmd->add_flag("--force", a.force, "run even when the memory plan says the configuration does not fit");
  cmd->add_flag("--no-pair-expert-wgrad", a.no_pair_expert_wgrad,
                "one expert wgrad pass per micro-batch (default: two micro-batches per pass when grad-accum >= 2 "
                "and the memory plan fits)");
  cmd->callback([cmd] {
    std::string command = "mixtune bench";
    for (const auto* opt : cmd->get_options())
      if (opt->count() > 0 && opt->get_name() != "--help") {
        command += " " + opt->get_name();
        if (opt->get_expected_min() > 0) command += " " + opt->as<std::string>();
      }
    run_bench(a, command);
  });
}

}  // namespace mt::cli
