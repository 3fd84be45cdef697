// The training recipe: a YAML file for `mixtune finetune RECIPE.yaml [--set key.path=value ...]`.
// Every key has a default except model.path, data.train and checkpoint.dir.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct RecipeModel {
  std::string path;
  std::string dtype = "bfloat16";  // bfloat16 | float32
  // A saved LoRA adapter (adapter_config.json + adapter_model.safetensors) to continue training; its config
  // gives the peft settings (a peft section, when present, must agree). Empty: a fresh adapter, or none.
  std::string adapter;
};

struct RecipeData {
  std::string train;
  std::string eval;  // empty = no eval set
  int64_t seq_len = 4096;
  bool pack = true;
  std::string truncation = "right";  // right | drop
  bool skip_bad_lines = false;
  std::string tokenizer;  // directory with tokenizer.json; empty = model.path
};

struct RecipeTrain {
  int64_t micro_batch_size = 1;
  int64_t grad_accum = 1;
  int64_t max_steps = 0;  // 0 = until the epochs end
  int64_t epochs = 1;
  uint64_t seed = 1234;
  std::string device = "auto";  // auto | cpu | cuda | cuda:N
  int64_t eval_every = 0;       // 0 = never
  int64_t log_every = 1;        // progress lines (not a TTY) every N steps; metrics.jsonl gets every step
  int64_t max_nonfinite_steps = 5;  // consecutive NaN/Inf steps (skipped) before training stops
  // CUDA activation memory: none | selective (recompute norms, RoPE, expert gathers, SwiGLU in the
  // backward) | full (keep only each layer's input, rerun the layer before its backward).
  std::string recompute = "selective";
  // CUDA: every reduction in a fixed order, so two runs (and a run and its stop-and-resume) are bitwise the
  // same; costs the flash-attention backward a second pass (docs/numerics.md has the measured cost). The
  // CPU engine is deterministic either way.
  bool deterministic = false;
};

struct RecipeOptimizer {
  std::string name = "adamw";
  double lr = 1e-5;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  std::string master_weights = "float32";  // float32 | none
  std::string moment_dtype = "float32";    // float32 | bfloat16 (CUDA only: half the moment memory)
  // float32 | bfloat16 (CUDA only): expert-weight gradients accumulated in bf16, as Transformers does with
  // bf16 parameters; halves the largest gradient buffers. The other gradients stay float32.
  std::string expert_grad_dtype = "float32";
  // false: HF Trainer's rule (no decay for norm weights and biases); true: decay every parameter, as
  // torch.optim.AdamW(model.parameters()) does.
  bool decay_norms_and_biases = false;
};

struct RecipeSchedule {
  std::string name = "constant";  // constant | linear | cosine
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;
};

struct RecipeClip {
  double max_grad_norm = 1.0;  // 0 disables clipping
};

struct RecipeCheckpoint {
  std::string dir;
  int64_t every_steps = 0;  // 0 = only the final checkpoint
  int64_t keep_last = 2;
};

// Parameter-efficient fine-tuning: present = train LoRA adapters (models/lora_adapter.h) on a frozen base.
struct RecipePeft {
  bool enabled = false;  // the recipe has a peft section (or model.adapter)
  std::string method = "lora";
  int64_t r = 16;
  double alpha = 32;
  double dropout = 0.0;  // only 0: LoRA dropout is not implemented (docs/lora.md)
  bool use_rslora = false;
  std::vector<std::string> target;  // the family's names (checked against the model when it is loaded)
};

// Mixture-of-experts training settings.
struct RecipeMoe {
  // DeepSeek-V3's auxiliary-loss-free load balancing (train/expert_load.h): after each optimizer step every MoE
  // layer's selection bias (e_score_correction_bias) moves by γ = bias_update_rate toward the experts that got fewer
  // tokens than the mean: bias_e += γ · sign(mean_load − load_e). 0: never (Transformers' behaviour). Needs a model
  // with that bias; not with LoRA (the bias belongs to the frozen base).
  double bias_update_rate = 0.0;
};

// Multi-process jobs (`mixtune launch`, mpirun, srun): every rank runs the recipe; the world size comes
// from the launcher's environment (distributed/process_group_env.h).
struct RecipeParallel {
  int64_t timeout_s = 600;  // a rendezvous or collective that takes longer fails on every rank
  // Expert parallelism: groups of `ep` consecutive ranks split each MoE layer's experts (E / ep each) and
  // exchange token rows; 1 = every rank runs all experts. The ranks must be a multiple of ep.
  int64_t ep = 1;
  // How the CUDA engine brings tokens to the experts (layers/cuda/expert_parallel_cuda.h): all_gather (each
  // token once per rank of the group), all_to_all (each routed slot to its expert's rank), or auto
  // (all_gather while ep <= the model's top-k). The CPU engine always sends per slot.
  std::string ep_dispatch = "auto";
  // all_gather dispatch: the buffers of a rank's expert rows get the largest load seen so far times this
  // (distributed/ep_row_budget.h), with no host read of the row count; a step that passes it runs again with
  // exact counts. 0: read the count on the host for every layer and micro-batch.
  double ep_row_headroom = 1.15;
  // How the CUDA engine's ranks exchange GPU data (distributed/cuda/device_communicator.h): nccl, or host
  // (staged through host memory and the TCP mesh; slow, but ranks may then share a GPU: rank r of a node
  // uses GPU r mod the node's GPUs; for checking multi-GPU runs on a machine with fewer GPUs).
  std::string gpu_collectives = "nccl";
  // ZeRO-1 (train/optimizer_shards.h): the optimizer state of the parameters every rank holds is split over
  // the ranks, each tensor's on one owner that updates it and broadcasts the result (the expert stacks' over
  // the ranks holding the same experts, when there are several). false: every rank keeps all of it (the same
  // results, more memory).
  bool shard_optimizer = true;
  // ZeRO-3 (train/sharded_params.h; both engines): those parameters themselves are kept only by their owner and
  // broadcast to the others for each use. reshard_after_forward false keeps each layer's fetched parameters
  // from its forward to its backward (one fetch less per layer and micro-batch, more memory).
  bool shard_parameters = false;
  bool reshard_after_forward = true;
};

// Upper bounds the recipe enforces: far above any practical run, low enough that the sizes computed from
// them (tokens per window, deadlines in milliseconds) cannot overflow.
constexpr int64_t kMaxSeqLen = int64_t{1} << 24;       // data.seq_len: 16,777,216 tokens per row
constexpr int64_t kMaxMicroBatch = int64_t{1} << 20;   // train.micro_batch_size: 1,048,576 rows
constexpr int64_t kMaxGradAccum = int64_t{1} << 20;    // train.grad_accum: 1,048,576 micro-batches
constexpr int64_t kMaxTimeoutS = 365LL * 24 * 3600;    // parallel.timeout_s: a year

struct Recipe {
  std::string file;  // the recipe's path, for errors found after loading (e.g. peft.target against the model)
  RecipeModel model;
  RecipeData data;
  RecipeTrain train;
  RecipeOptimizer optimizer;
  RecipeSchedule schedule;
  RecipeClip clip;
  RecipeCheckpoint checkpoint;
  RecipeParallel parallel;
  RecipePeft peft;
  RecipeMoe moe;
};

// Loads and validates a recipe; each of `sets` is "section.key=value" (value parsed as YAML,
// e.g. "optimizer.betas=[0.9,0.95]") and is applied before validation. Throws a one-line mt::Error.
Recipe recipe_load(const std::string& path, const std::vector<std::string>& sets);

}  // namespace mt
