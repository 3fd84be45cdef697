// Up-front GPU memory plan of the CUDA training path, in the spirit of llm.c: before training, add up
// what the model will keep (bf16 parameters, fp32 gradients, AdamW state, saved activations plus the
// largest transient of one step, workspace), print it, and refuse a configuration that cannot fit,
// naming the largest micro-batch and sequence length that would.
// The activations are the blocks' cost models summed over the layers (models/decoder_costs.h, layers/costs/:
// each lists the tensors its CUDA block keeps); memory_plan.cpp adds the model-level tensors, the parameters,
// gradients, optimizer state and workspace.
#pragma once
#include <cstdint>
#include <string>

#include "layers/costs/block_cost.h"  // Recompute
#include "models/spec/decoder_spec.h"

namespace mt {

// "none" | "selective" | "full"; anything else throws a one-line mt::Error naming `where`
// (e.g. "recipe.yaml: train.recompute").
Recompute recompute_parse(const std::string& name, const std::string& where);
const char* recompute_name(Recompute r);

struct MemoryPlanInput {
  DecoderSpec cfg;
  int64_t micro_batch = 1, seq = 4096;
  Recompute recompute = Recompute::selective;
  bool fp32_master = true;    // optimizer keeps fp32 master copies of the bf16 params
  bool bf16_moments = false;  // AdamW moments in bf16 (else fp32)
  bool bf16_expert_grads = false;  // stacked expert-weight gradients in bf16 (else fp32, as every other gradient)
  // Expert wgrads of two micro-batches in one pass (layers/cuda/expert_wgrad_passes.h): one micro-batch's
  // dY and X of both expert GEMMs held per MoE layer across the micro-batch boundary.
  bool pair_expert_wgrad = false;
  // Expert parallelism over this many ranks: each holds 1/ep of the stacked expert weights (and their
  // gradients and optimizer state) and keeps the rows it received for its experts under selective recompute.
  int64_t expert_parallel = 1;
  // The all-gather dispatch (distributed/ep_dispatch_mode.h): each MoE layer keeps the group's gathered
  // input [ep·T, H] and routing weights instead of the received expert rows.
  bool ep_all_gather = false;
  // Its row budget's headroom (distributed/ep_row_budget.h): the expert rows of a micro-batch are counted at the
  // even share T·k times this when it is above 1 (the budget a balanced router gets; a skewed one's is larger).
  double ep_row_headroom = 0;
  // ZeRO-1 over this many ranks (the job's; train/optimizer_shards.h): the optimizer state of the replicated
  // parameters is split by whole tensors, and under expert parallelism with optimizer_shards / expert_parallel
  // > 1 replicas of each expert group, the expert stacks' state over those replicas; the plan counts the
  // largest rank's share.
  int64_t optimizer_shards = 1;
  // ZeRO-3 over those ranks (train/sharded_params.h): a rank holds its share of the replicated parameters
  // plus the groups it has fetched, at most two at once (the one being read and the prefetched next one)
  // when reshard_after_forward; without it every layer's stay from its forward to its backward (no saving).
  bool shard_parameters = false;
  bool reshard_after_forward = true;
  bool deterministic = false;  // train.deterministic: flash attention's backward keeps dK/dV per query head
  // LoRA (recipe peft; models/lora_adapter.h): the base frozen, so it has bf16 parameters only (no gradients, no
  // optimizer state, no master); the adapter's lora_params fp32 parameters with fp32 gradients and moments, and
  // lora_full_params base parameters trained in full (the router: bf16, fp32 gradients, moments and master).
  // Activations are counted as for full training (the adapters' [T, r] intermediates are small beside them).
  // Not with expert parallelism or sharded parameters (refused: LoRA runs in one process so far).
  bool lora = false;
  int64_t lora_params = 0, lora_full_params = 0;
  // The CUDA engine's additions (memory_plan_set_lora): the adapter's bf16 working copies beside its fp32 masters
  // (models/cuda/cuda_lora.h), and per token the u = x·A'ᵀ [T, r] every adapted slot keeps (an expert stack k rows
  // per token) plus the grouped path's temporaries of the widest adapted stack (kernels/cuda/lora.h: its [N, out]
  // output before the add or its [N, in] input gradient, du and s·u) on top of a layer's backward peak.
  bool lora_working_copies = false;
  int64_t lora_saved_per_token = 0, lora_transient_per_token = 0;

  int64_t device_bytes = 0;   // total memory of the GPU (cudaMemGetInfo total)
  int64_t reserve_bytes = 0;  // kept free for the CUDA context / fragmentation (caller picks, e.g. 1.5 GiB + 3%)
};

struct LoraTable;  // models/lora_adapter.h

// Sets in.lora and its counts for `table` over in.cfg; gpu: the CUDA engine's working copies and activations too.
void memory_plan_set_lora(MemoryPlanInput& in, const LoraTable& table, bool gpu);

struct MemoryPlan {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, total = 0;
  int64_t available = 0;        // device_bytes - reserve_bytes
  bool fits = false;
  int64_t max_micro_batch = 0;  // largest micro_batch at this seq that fits (0: none)
  int64_t max_seq = 0;          // largest seq (multiple of 128) at this micro_batch that fits (0: none)

  // activations = activations_saved + activations_transient: what forward keeps for backward, plus the
  // largest buffer set alive at one moment on top of it (one layer's backward, or the LM head's loss).
  int64_t activations_saved = 0, activations_transient = 0;
  // The request, for table() and refusal().
  int64_t param_count = 0, layers = 0, moe_layers = 0;  // param_count: held on this rank
  int64_t expert_parallel = 1, optimizer_shards = 1;
  int64_t expert_replicas = 1;  // > 1: the expert stacks' optimizer state sharded over this many replicas
  bool params_sharded = false;  // the parameters row is a ZeRO-3 share plus two fetched groups
  int64_t optimizer_param_count = 0;  // parameters whose optimizer state this rank keeps
  int64_t micro_batch = 0, seq = 0, device_bytes = 0, reserve_bytes = 0;
  Recompute recompute = Recompute::selective;
  bool fp32_master = true, bf16_moments = false, bf16_expert_grads = false;
  bool lora = false;                 // rows as MemoryPlanInput::lora describes
  int64_t lora_params = 0, lora_full_params = 0;
  bool full_recompute_fits = false;  // the same request with recompute = full fits
  bool no_master_fits = false;       // the same request without fp32 master weights fits

  std::string table() const;    // multi-line human table in GiB, for the training log
  // One line: "does not fit: needs X GiB of Y GiB (...); largest micro_batch that fits at seq S: M;
  // largest seq at micro_batch B: N[; or set train.recompute: full]". Empty when the plan fits.
  std::string refusal() const;
};

// What the CUDA path keeps free outside the allocator (the CUDA context, cuBLASLt, NCCL): 1.5 GiB + 3% of
// the device.
inline int64_t memory_plan_reserve_bytes(int64_t device_bytes) { return (int64_t{3} << 29) + device_bytes * 3 / 100; }

// Whether to pair expert wgrads (layers/cuda/expert_wgrad_passes.h): grad_accum >= 2 and the plan with the
// held tensors fits (`in` is the plan input without pairing).
bool pairing_wanted(MemoryPlanInput in, int64_t grad_accum);

// Throws a one-line mt::Error for sizes out of range (micro_batch, seq, device_bytes, reserve_bytes,
// config dimensions). A plan that does not fit is not an error: check `fits`.
MemoryPlan memory_plan(const MemoryPlanInput& in);

}  // namespace mt
