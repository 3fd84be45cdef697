// `mixtune bench`: timed optimizer steps of the CUDA training path on a model config (a preset sliced
// to N layers, or a checkpoint's config), synthetic random tokens, the real router. Reports tokens/s,
// model TFLOP/s (3 × the blocks' forward FLOPs per token, models/decoder_costs.h: 6 × matmul parameters per
// token + causal attention, router excluded: the NeMo / Megatron formula), MFU against a dense bf16 GEMM measured on the same GPU at start-up, peak memory
// and a per-phase GPU time breakdown, as one JSON object (bench/README.md describes the fields).
// Under `mixtune launch --nproc N -- bench ...` (or mpirun) every rank trains on its own GPU (LOCAL_RANK)
// with its own grad_accum micro-batches, gradients summed over NCCL; --ep splits the experts. Rank 0
// prints the JSON (per-GPU figures, and the expert all-to-all's bytes and bandwidth).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/ep_row_budget.h"
#include "models/spec/decoder_spec.h"
#include "train/memory_plan.h"

namespace mt {

struct BenchOptions {
  std::string preset = "qwen3-30b-a3b";
  std::string model_dir;  // non-empty: take the config (and the weights) from this checkpoint
  int64_t layers = 0;     // > 0: slice the config to this many layers
  int64_t seq = 4096, micro_batch = 1, grad_accum = 8, steps = 5, warmup = 2;
  std::string precision = "bf16";  // bf16: bf16 params + bf16 AdamW moments; fp32-master: fp32 masters + moments
  Recompute recompute = Recompute::none;
  bool force = false;  // run even when the memory plan says it does not fit
  bool no_pair_expert_wgrad = false;  // never pair expert wgrads (default: when grad_accum >= 2 and it fits)
  bool shard_optimizer = true;        // multi-GPU: ZeRO-1 of the replicated parameters' state (optimizer_shards.h)
  bool shard_parameters = false;      // multi-GPU: ZeRO-3 of those parameters (sharded_params.h; reshard after forward)
  std::string gpu_collectives = "nccl";  // nccl | host (distributed/cuda/device_communicator.h; ranks may share a GPU)
  int device = 0;   // one process; a multi-rank job uses LOCAL_RANK
  int64_t ep = 1;   // expert-parallel ranks (multi-rank jobs)
  std::string ep_dispatch = "auto";
  double ep_row_headroom = EpRowBudget::kDefaultHeadroom;  // all_gather dispatch (distributed/ep_row_budget.h)  // auto | all_gather | all_to_all (layers/cuda/expert_parallel_cuda.h)
  // Labels -100 on the first floor(prompt_fraction · seq) tokens of each row: SFT data whose prompts carry
  // no loss (the LM head then runs on the other rows only). Tokens/s and the model FLOP count still count
  // every token, as the Transformers baseline's do.
  double prompt_fraction = 0.0;
  // A probe (kernels/cuda/router.h, set_balanced_routing_probe): the experts' loads made exactly even after the
  // router. The losses are then meaningless; the step time is what a perfectly balanced router would give.
  bool balanced_router = false;
  bool deterministic = false;  // train.deterministic's kernels (CudaModelOptions::deterministic), to measure its cost
  // LoRA (lora_r > 0; one GPU): adapters of rank lora_r (alpha lora_alpha, 0: 2·r) on lora_targets (the family's
  // names, models/spec/lora_targets.h), PEFT's init, the base frozen. The adapter trains in fp32 with fp32 AdamW
  // moments whatever --precision says (PEFT's default); a full-trained router keeps an fp32 master.
  int64_t lora_r = 0;
  double lora_alpha = 0;
  std::vector<std::string> lora_targets;
  uint64_t seed = 1234;
  std::string command;  // the command line, echoed into the JSON
};

// The JSON on rank 0; an empty object on the other ranks.
nlohmann::ordered_json bench_run(const BenchOptions& o, std::FILE* log);

}  // namespace mt
