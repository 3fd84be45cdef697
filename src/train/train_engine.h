// Where the numbers of a training step are computed: the trainer (train/trainer.cpp) owns the data,
// schedule, metrics and checkpoints, and asks an engine to run optimizer steps. The CPU engine is the
// reference (models/decoder_model.h + train/adamw.h); the CUDA engine (train/cuda/) runs the same
// step on one GPU, or on several over NCCL, and registers itself here when the binary is built with CUDA.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "models/lora_adapter.h"
#include "train/adamw.h"
#include "train/optimizer_shards.h"
#include "train/recipe.h"

namespace mt {

struct EngineStep {
  double loss = 0, ce_loss = 0, aux_loss = 0;  // aux: mean over the micro-batches
  double grad_norm = 0;                        // before clipping
  bool finite = true;                          // false: the update was skipped
  // The step's routing balance over every rank's tokens (train/expert_load.h): the largest over the MoE layers of
  // max_e load_e / mean load, 1 = even. 0: the model has no routed experts.
  double expert_load_max_over_mean = 0;
};

struct EngineEval {
  double ce_sum = 0, aux_loss = 0;
  int64_t tokens = 0;
};

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;
  virtual std::string device_name() const = 0;
  // One optimizer step: zero the gradients, forward+backward every micro-batch of `window` with the CE
  // sum divided by ce_divisor, global grad norm, and — when the loss and the norm are finite — clipping
  // to max_grad_norm (0: off) and AdamW at lr.
  virtual EngineStep step(const std::vector<Batch>& window, double ce_divisor, double lr, double max_grad_norm) = 0;
  virtual EngineEval eval(const Batch& b) = 0;
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t t) = 0;
  // Brings the trained parameters into the CausalLM the engine was made from (before a save). In a job of
  // several ranks, at least the rows this rank writes (train/shared_save.h: SaveShare).
  virtual void weights_to_host() = 0;
  // Optimizer state as host tensors named "<param>.exp_avg|exp_avg_sq|master" (for optimizer.safetensors),
  // full shapes; in a job of several ranks at least the rows this rank writes hold data.
  virtual std::vector<std::pair<std::string, Tensor>> optimizer_state_host() = 0;
  virtual void optimizer_state_load(const std::string& checkpoint_dir) = 0;
  // Which rank keeps each replicated parameter's (and expert stack's, over its replicas) optimizer state
  // (train/optimizer_shards.h; not sharded alone or with parallel.shard_optimizer false).
  virtual const OptimizerShards& optimizer_shards() const = 0;
  // Bytes of optimizer state (moments, masters) this rank keeps: what ZeRO-1 shrinks.
  virtual int64_t optimizer_state_bytes() = 0;
  virtual int64_t peak_memory_bytes() const = 0;    // peak allocated (CPU: host tensors; CUDA: device allocator)
  virtual int64_t peak_reserved_bytes() const = 0;  // CUDA: peak obtained from the driver; CPU: = allocated
  // The LoRA adapter being trained (recipe `peft`), on the host after weights_to_host(); null for full training.
  virtual LoraWeights* lora() { return nullptr; }
};

// The recipe's optimizer section as AdamW hyper-parameters (both engines).
AdamWOptions adamw_options_from(const Recipe& r);

class Communicator;

// The CPU reference engine. lm must outlive it. With a communicator of more than one rank it trains data
// parallel: each rank runs forward/backward on its own micro-batches of the window, then the gradients
// and the loss sums are summed over the ranks (bitwise the same on every rank) before the identical
// clipping and AdamW step on every rank's copy of the parameters. The routed-expert loads of the step are summed
// over the ranks too (with the loss sums) and, with moe.bias_update_rate > 0, update every rank's selection biases
// alike after the optimizer step (train/expert_load.h). With parallel.ep > 1 a rank's copy holds
// its own experts only (lm's expert stacks become that slice), their gradients are summed over the ranks
// holding the same experts and their norms over the expert-parallel group. comm must outlive the engine.
std::unique_ptr<TrainEngine> cpu_engine_create(CausalLM& lm, const Recipe& r, Communicator* comm = nullptr);

// The CUDA engine factory, registered by the CUDA library at start-up (absent in a CPU-only build).
struct CudaEngineHooks {
  std::function<int()> device_count;
  std::function<std::string(const DecoderSpec&)> unsupported;  // "" or why the model cannot train on CUDA
  // comm: the job's host communicator when it has more than one rank (each rank trains on its own GPU,
  // gradients summed over NCCL; parallel.ep splits the experts), else null.
  std::function<std::unique_ptr<TrainEngine>(CausalLM& lm, const Recipe& r, int device, std::FILE* log,
                                             Communicator* comm)>
      create;
  // LoRA (recipe peft): one process on one GPU, the base frozen; the engine trains and keeps `adapter`
  // (TrainEngine::lora(); train/lora_engine.h: lora_adapter_for_run).
  std::function<std::unique_ptr<TrainEngine>(CausalLM& lm, const Recipe& r, LoraWeights adapter, int device,
                                             std::FILE* log)>
      create_lora;
};
void cuda_engine_register(CudaEngineHooks hooks);
const CudaEngineHooks* cuda_engine_hooks();  // null without CUDA support

// train.device resolved for a model: -1 = CPU, else the CUDA device index. `why` receives a one-line reason
// for the choice when train.device is auto (auto falls back to the CPU for a model the CUDA path cannot
// run). Throws for cuda/cuda:N without a usable device or for an unsupported model. With several ranks on
// this node (local_world > 1) each rank takes the GPU of its local rank; auto falls back to the CPU when
// the node has fewer GPUs than ranks, and cuda:N is refused. With parallel.gpu_collectives host the ranks
// share the GPUs (local rank mod the GPU count).
int train_device_resolve(const Recipe& r, const DecoderSpec& cfg, std::string* why, int local_rank = 0,
                         int local_world = 1);

}  // namespace mt
