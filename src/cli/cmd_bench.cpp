// mixtune bench: timed training steps on the GPU, printed as one JSON object (train/cuda/bench_run.h).
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/error.h"
#include "distributed/ep_dispatch_mode.h"
#include "distributed/ep_row_budget.h"
#include "io/atomic_file.h"
#include "models/spec/config_writer.h"
#include "models/decoder_costs.h"
#include "models/lora_adapter.h"
#include "models/presets.h"
#include "models/spec/decoder_spec.h"
#include "train/memory_plan.h"
#ifdef MIXTUNE_WITH_CUDA
#include "train/cuda/bench_run.h"
#endif

namespace mt::cli {

namespace {
struct BenchArgs {
  std::string preset = "qwen3-30b-a3b", model, precision = "bf16", recompute = "none", device = "cuda:0", json_out;
  std::string ep_dispatch = "auto", gpu_collectives = "nccl";
  double ep_row_headroom = mt::EpRowBudget::kDefaultHeadroom;
  int64_t layers = 0, seq = 4096, micro_batch = 1, grad_accum = 8, steps = 5, warmup = 2, ep = 1;
  int64_t ranks = 0;  // --plan-only: the job's ranks (0: --ep)
  bool force = false, no_pair_expert_wgrad = false, plan_only = false, no_shard_optimizer = false;
  bool shard_parameters = false, balanced_router = false, deterministic = false;
  double prompt_fraction = 0.0;
  double device_gib = 133.9;  // an H200's cudaMemGetInfo total (143,771,566,080 bytes)
  int64_t lora_r = 0;         // > 0: LoRA adapters of this rank on lora_targets, the base frozen
  double lora_alpha = 0;      // 0: 2·r
  std::vector<std::string> lora_targets;
};

// --lora-*: checked here (the family's target names are checked against the model by lora_table_of).
void check_lora_args(const BenchArgs& a) {
  if (a.lora_r < 0) fail("bench: --lora-r must be >= 1 (0: full fine-tuning), found {}", a.lora_r);
  if (a.lora_r == 0 && (!a.lora_targets.empty() || a.lora_alpha != 0))
    fail("bench: --lora-targets and --lora-alpha need --lora-r");
  if (a.lora_alpha < 0) fail("bench: --lora-alpha must be > 0 (0: 2·r), found {}", a.lora_alpha);
}

// --plan-only: the memory plan one GPU of the run would print, without a GPU (a dry run for machines not at
// hand, e.g. 8 ranks of a full-depth model). The bench's own precision settings; expert wgrads paired when
// grad-accum >= 2 and that still fits. Exit status 0 when it fits, else the refusal (exit 1).
void run_plan_only(const BenchArgs& a) {
  nlohmann::json j;
  if (!a.model.empty())
    j = DecoderSpec::from_file(a.model + "/config.json").to_json();
  else
    j = preset_config_json(a.preset);
  if (a.layers > 0) config_json_set_layers(j, a.layers);
  if (a.layers < 0) fail("--layers must be >= 0 (0: all the model's layers), found {}", a.layers);
  if (!(a.device_gib > 0 && a.device_gib < 1e6)) fail("--device-gib must be positive, found {}", a.device_gib);
  if (a.precision != "bf16" && a.precision != "fp32-master")
    fail("--precision must be bf16 or fp32-master, found '{}'", a.precision);
  MemoryPlanInput in;
  in.cfg = DecoderSpec::from_json(j, a.model.empty() ? "preset " + a.preset : a.model);
  if (a.ep < 1 || in.cfg.num_experts() % a.ep != 0)
    fail("--ep {} must be >= 1 and divide the model's {} experts", a.ep, in.cfg.num_experts());
  in.micro_batch = a.micro_batch;
  in.seq = a.seq;
  in.recompute = recompute_parse(a.recompute, "--recompute");
  in.deterministic = a.deterministic;
  const bool fp32_master = a.precision == "fp32-master";
  in.fp32_master = fp32_master;
  in.bf16_moments = !fp32_master;
  in.bf16_expert_grads = !fp32_master;
  in.expert_parallel = a.ep;
  in.ep_all_gather = a.ep > 1 && ep_dispatch_mode_parse(a.ep_dispatch, a.ep, in.cfg.experts_per_token(),
                                                        "--ep-dispatch") == EpDispatchMode::all_gather;
  in.ep_row_headroom = a.ep_row_headroom;
  in.device_bytes = static_cast<int64_t>(a.device_gib * static_cast<double>(int64_t{1} << 30));
  in.reserve_bytes = memory_plan_reserve_bytes(in.device_bytes);
  check_lora_args(a);
  if (a.lora_r > 0) {  // as bench_run: PEFT's fp32 adapter with fp32 moments, the router's fp32 master
    LoraConfig lc;
    lc.r = a.lora_r;
    lc.alpha = a.lora_alpha > 0 ? a.lora_alpha : 2.0 * static_cast<double>(a.lora_r);
    lc.target = a.lora_targets;
    memory_plan_set_lora(in, lora_table_of(in.cfg, lc, "bench --lora-targets"), /*gpu=*/true);
    in.fp32_master = true;
    in.bf16_moments = false;
    if (a.ep > 1 || a.ranks > 1) fail("bench: --lora-r plans one GPU (no --ep or --ranks)");
  }
  in.pair_expert_wgrad = !a.no_pair_expert_wgrad && !in.lora && pairing_wanted(in, a.grad_accum);
  // A job of --ranks ranks (default --ep): with more ranks than --ep, each expert group has ranks / ep replicas,
  // over which ZeRO-1 shards the expert stacks' state.
  const int64_t ranks = a.ranks == 0 ? a.ep : a.ranks;
  if (ranks < 1 || ranks % a.ep != 0) fail("--ranks {} must be a positive multiple of --ep {}", a.ranks, a.ep);
  in.optimizer_shards = a.no_shard_optimizer ? 1 : ranks;
  in.shard_parameters = a.shard_parameters;
  const MemoryPlan plan = memory_plan(in);
  std::printf("%s\n", plan.table().c_str());
  // The FLOPs per token the run's JSON would report (models/decoder_costs.h), for comparison with another tool's
  // count (bench/hf_baseline.py --print-flops) without a GPU.
  std::printf("model FLOPs per token at seq %lld (training: 3 x forward; router, norms and biases excluded): %.0f\n",
              static_cast<long long>(a.seq), decoder_train_flops_per_token(in.cfg, a.seq));
  std::fflush(stdout);
  if (!plan.fits) fail("bench --plan-only: {}", plan.refusal());
}

void run_bench(const BenchArgs& a, const std::string& command) {
  if (!(a.prompt_fraction >= 0.0 && a.prompt_fraction < 1.0))
    fail("bench: --prompt-fraction must be in [0, 1), found {}", a.prompt_fraction);
  if (a.plan_only) {
    run_plan_only(a);
    return;
  }
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
  o.shard_optimizer = !a.no_shard_optimizer;
  o.shard_parameters = a.shard_parameters;
  o.gpu_collectives = a.gpu_collectives;
  o.prompt_fraction = a.prompt_fraction;
  o.balanced_router = a.balanced_router;
  o.deterministic = a.deterministic;
  o.command = command;
  o.ep = a.ep;
  o.ep_dispatch = a.ep_dispatch;
  o.ep_row_headroom = a.ep_row_headroom;
  check_lora_args(a);
  o.lora_r = a.lora_r;
  o.lora_alpha = a.lora_alpha;
  o.lora_targets = a.lora_targets;
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
  std::string presets;  // the registry's, so that a new family's presets are listed without touching this file
  for (const PresetInfo& p : preset_list()) presets += (presets.empty() ? "" : " | ") + p.name;
  cmd->add_option("--preset", a.preset, "model shapes (default qwen3-30b-a3b): " + presets);
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
  cmd->add_option("--ep-dispatch", a.ep_dispatch,
                  "how tokens reach the experts: all_gather (each token once per rank), all_to_all (each routed "
                  "slot to its expert's rank), auto (all_gather while ep <= top-k)")
      ->check(CLI::IsMember({"auto", "all_gather", "all_to_all"}));
  cmd->add_option("--ep-row-headroom", a.ep_row_headroom,
                  "all_gather dispatch: buffers of a rank's expert rows sized at the largest load seen times this, "
                  "no host read of the count (a step past it runs again with exact counts); 0 reads the count "
                  "every layer and micro-batch (default 1.15)")
      ->check(CLI::Range(0.0, 16.0));
  cmd->add_option("--prompt-fraction", a.prompt_fraction,
                  "labels -100 on the first F of each row's tokens, as SFT data whose prompts carry no loss "
                  "(the LM head then skips those rows); default 0");
  cmd->add_flag("--balanced-router", a.balanced_router,
                "a probe, not training: every token's experts replaced by a perfectly balanced assignment after the "
                "router (T·k/E rows each), to measure what the real router's uneven loads cost; JSON router "
                "\"balanced (probe)\"");
  cmd->add_flag("--deterministic", a.deterministic,
                "train.deterministic's kernels: every reduction in a fixed order (bitwise repeatable steps)");
  cmd->add_option("--lora-r", a.lora_r,
                  "train LoRA adapters of this rank (PEFT's init and fp32 adapter) on --lora-targets, the base frozen; "
                  "one GPU (default 0: full fine-tuning)");
  cmd->add_option("--lora-alpha", a.lora_alpha, "LoRA alpha (scale alpha / r; default 2·r)");
  cmd->add_option("--lora-targets", a.lora_targets,
                  "comma-separated LoRA targets, the family's names (Qwen3-MoE: q_proj,k_proj,v_proj,o_proj,"
                  "gate_proj,up_proj,down_proj,experts; router trains in full)")
      ->delimiter(',');
  cmd->add_option("--json-out", a.json_out, "also write the JSON to this file");
  cmd->add_flag("--force", a.force, "run even when the memory plan says the configuration does not fit");
  cmd->add_flag("--plan-only", a.plan_only,
                "print the memory plan of one GPU (with --ep: one expert-parallel rank) and exit; needs no GPU");
  cmd->add_option("--device-gib", a.device_gib, "--plan-only: the GPU's memory in GiB (default 133.9, an H200)");
  cmd->add_flag("--no-shard-optimizer", a.no_shard_optimizer,
                "multi-GPU: every rank keeps the whole optimizer state of the replicated parameters (default: each "
                "tensor's on one owner rank, ZeRO-1, and the experts' over their replicas; --plan-only takes the "
                "job's ranks from --ranks)");
  cmd->add_option("--ranks", a.ranks,
                  "--plan-only: the job's ranks (a multiple of --ep; default --ep): the optimizer state is sharded "
                  "over them, and the experts' over the ranks / ep replicas of each expert group");
  cmd->add_flag("--shard-parameters", a.shard_parameters,
                "multi-GPU: the replicated parameters live on their owner ranks too, fetched per layer (ZeRO-3, "
                "train/sharded_params.h); needs the optimizer state sharded");
  cmd->add_option("--gpu-collectives", a.gpu_collectives,
                  "multi-GPU: nccl, or host (staged through host memory; slow, lets ranks share a GPU: rank r uses "
                  "GPU r mod the GPU count)")
      ->check(CLI::IsMember({"nccl", "host"}));
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
