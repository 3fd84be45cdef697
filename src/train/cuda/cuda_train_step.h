// One optimizer step on one GPU, from device-resident parameters: gradients zeroed, forward+backward
// of every micro-batch (queued back to back), global grad norm and clip coefficient on the device,
// one sync to read the losses and the norm, then — if they are finite — multi-tensor AdamW (which
// reads the clip coefficient from device memory). Shared by the training engine and `mixtune bench`.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/qwen3_moe_cuda_model.h"
#include "train/memory_plan.h"
#include "train/train_engine.h"

namespace mt {

struct CudaTrainStepOptions {
  CudaModelOptions model;
  DType expert_grad_dtype = DType::F32;  // F32 | BF16 (experts_gate_up / experts_down gradients)
  // Expert wgrads of two micro-batches in one dW pass (CudaModelOptions::pair_expert_wgrad): half the dW
  // read-add-write traffic for one micro-batch's expert activations held per layer. The engine and the
  // bench turn it on when grad_accum >= 2 and the memory plan fits with it (pairing_wanted).
  bool pair_expert_wgrad = false;
  cuda::CudaAdamWOptions adamw;
  std::function<bool(const std::string&)> decays;  // null: every parameter decays
};

class CudaTrainStep {
 public:
  // weights: BF16 on cuda:device; kept by reference.
  CudaTrainStep(const Qwen3MoeConfig& cfg, Qwen3MoeWeights& weights, int device, const CudaTrainStepOptions& o);

  EngineStep step(const std::vector<CudaBatch>& window, double ce_divisor, double lr, double max_grad_norm);
  EngineEval eval(const CudaBatch& b);

  Qwen3MoeCudaModel& model() { return model_; }
  cuda::CudaAdamW& optimizer() { return adamw_; }
  int device() const { return device_; }

 private:
  int device_;
  Qwen3MoeCudaModel model_;
  Qwen3MoeWeights grads_;
  std::vector<const Tensor*> grad_list_;
  cuda::CudaAdamW adamw_;
  Tensor norm_, coef_;
};

// Whether to pair expert wgrads: grad_accum >= 2 and the plan with the held tensors fits (`in` is the plan
// input without pairing).
bool pairing_wanted(MemoryPlanInput in, int64_t grad_accum);

// Gradient buffers: zeros on cuda:device shaped like cfg's parameters, F32 except the stacked expert
// weights, which get expert_dtype.
Qwen3MoeWeights cuda_grad_buffers(const Qwen3MoeConfig& cfg, DType expert_dtype, int device);

}  // namespace mt
