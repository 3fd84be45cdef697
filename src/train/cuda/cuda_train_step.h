// One optimizer step on one GPU, from device-resident parameters: gradients zeroed, forward+backward
// of every micro-batch (queued back to back), global grad norm and clip coefficient on the device,
// one sync to read the losses and the norm, then — if they are finite — multi-tensor AdamW (which
// reads the clip coefficient from device memory). Shared by the training engine and `mixtune bench`.
// Under the all-gather expert dispatch the same sync reads whether any layer's expert rows passed their
// budget (distributed/ep_row_budget.h) on any rank; if so, the micro-batches run again with exact row
// counts before the update, which then sees the same gradients as a run that always counted them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/cuda_lora.h"
#include "models/cuda/decoder_cuda_model.h"
#include "train/expert_load.h"
#include "train/memory_plan.h"
#include "train/optimizer_shards.h"
#include "train/train_engine.h"

namespace mt {

class Communicator;
class DeviceCommunicator;

// The collectives of a multi-GPU step (all null: one GPU). Gradients of the replicated parameters are
// summed over `world` once per optimizer step (after the last micro-batch; under ZeRO-1 each onto its owner
// only); the experts' over `expert_replicas` (the ranks holding the same experts when world > ep; under ZeRO-1
// each stack onto its owner among them) or, without expert parallelism, over `world`. Under expert parallelism
// the experts' squared norms are summed over the EP group so the clipping norm is the whole model's. Loss sums
// travel over `host` (the TCP communicator).
struct CudaStepCollectives {
  Communicator* host = nullptr;
  DeviceCommunicator* world = nullptr;
  DeviceCommunicator* expert_replicas = nullptr;
  CudaExpertParallel* ep = nullptr;  // its row budget is read and raised once per step
  bool active() const { return world != nullptr; }
};

struct CudaTrainStepOptions {
  CudaModelOptions model;
  DType expert_grad_dtype = DType::F32;  // F32 | BF16 (experts_gate_up / experts_down gradients)
  // Expert wgrads of two micro-batches in one dW pass (CudaModelOptions::pair_expert_wgrad): half the dW
  // read-add-write traffic for one micro-batch's expert activations held per layer. The engine and the
  // bench turn it on when grad_accum >= 2 and the memory plan fits with it (pairing_wanted).
  bool pair_expert_wgrad = false;
  cuda::CudaAdamWOptions adamw;
  std::function<bool(const std::string&)> decays;  // null: every parameter decays
  CudaStepCollectives collectives;
  // ZeRO-1 over collectives.world (train/optimizer_shards.h, in weights.named_parameters() order), and of the
  // expert stacks over collectives.expert_replicas: each sharded gradient is summed onto its owner only, this
  // rank's AdamW keeps and updates only the parameters it owns (and those of owner -1), then every sharded
  // parameter is broadcast from its owner. Default: not sharded.
  OptimizerShards shards;
  // ZeRO-3 (train/sharded_params.h; model.residency fetches them): the sharded parameters live on their
  // owners only, so the updated ones are not broadcast (each is fetched at its next use).
  bool params_sharded = false;
  // LoRA (models/cuda/cuda_lora.h; it must outlive the step): the base is frozen except the parameters its table
  // trains in full (target `router`). Gradients exist only for the adapter and those; gradient norm, clipping and
  // AdamW run over them alone (the adapter's fp32 masters updated in place, then its working copies refreshed);
  // no frozen parameter gets a gradient buffer, moments or a master copy. One GPU only (no collectives).
  CudaLora* lora = nullptr;
  // DeepSeek-V3's auxiliary-loss-free balancing (recipe moe.bias_update_rate, train/expert_load.h): after each
  // optimizer step every MoE layer's selection bias (the weights' router_score_bias, F32 on the device) moves by this
  // rate from the step's loads, summed over the ranks. 0: never. The loads are counted either way (the metric).
  double expert_bias_rate = 0;
};

class CudaTrainStep {
 public:
  // weights: BF16 on cuda:device; kept by reference.
  CudaTrainStep(const DecoderSpec& cfg, ModelWeights& weights, int device, const CudaTrainStepOptions& o);

  // EngineStep::expert_load_max_over_mean comes from the step's routed-expert loads (every rank's).
  EngineStep step(const std::vector<CudaBatch>& window, double ce_divisor, double lr, double max_grad_norm);
  EngineEval eval(const CudaBatch& b);

  DecoderCudaModel& model() { return model_; }
  cuda::CudaAdamW& optimizer() { return adamw_; }  // this rank's parameters only when sharded
  const OptimizerShards& shards() const { return shards_; }
  int64_t optimizer_state_bytes();  // this rank's AdamW state (moments, masters)
  // Steps that ran their micro-batches twice because the expert rows passed their budget.
  int64_t reruns() const { return reruns_; }
  int device() const { return device_; }

 private:
  int device_;
  void reduce_gradients(cudaStream_t stream);
  void complete_sumsq(Tensor& sumsq, cudaStream_t stream);
  void broadcast_updates(cudaStream_t stream);
  void update_expert_biases(cudaStream_t stream);
  // Zeroed gradients, forward+backward of the window, reductions and the norm, the one sync, the losses;
  // exact_rows: the expert rows counted on the host. Sets *rerun when the budget was passed on some rank.
  EngineStep run_window(const std::vector<CudaBatch>& window, double ce_divisor, double max_grad_norm,
                        bool exact_rows, bool* rerun);

  CudaStepCollectives col_;
  int64_t steps_ = 0;  // steps taken here (named in collective errors)
  int64_t reruns_ = 0;
  ModelWeights& weights_;
  ExpertLoads loads_host_;  // the step's loads read back (summed over the ranks)
  ExpertLoads loads_;       // on the device: the model adds into them
  double expert_bias_rate_ = 0;
  DecoderCudaModel model_;
  CudaLora* lora_ = nullptr;
  ModelWeights grads_;     // undefined for a frozen parameter (LoRA)
  LoraWeights lora_grads_;  // the adapter's (LoRA), else empty
  std::vector<const Tensor*> grad_list_;
  std::vector<bool> is_expert_;  // per grad_list_ entry
  OptimizerShards shards_;
  bool params_sharded_ = false;
  std::vector<const Tensor*> updated_grads_;  // grad_list_'s entries of the parameters this rank updates
  std::vector<Tensor*> params_;               // weights.named_parameters(), for the broadcasts
  cuda::CudaAdamW adamw_;
  Tensor norm_, coef_;
};

// Gradient buffers: zeros on cuda:device shaped like cfg's parameters, F32 except the stacked expert
// weights, which get expert_dtype (and hold experts_held experts when >= 0).
ModelWeights cuda_grad_buffers(const DecoderSpec& cfg, DType expert_dtype, int device,
                                  int64_t experts_held = -1);
// The base's gradient buffers under LoRA: F32 zeros on cuda:device for the parameters `table` trains in full,
// undefined (frozen: none computed) for every other one.
ModelWeights cuda_lora_base_grads(const DecoderSpec& cfg, const LoraTable& table, int device);

}  // namespace mt
