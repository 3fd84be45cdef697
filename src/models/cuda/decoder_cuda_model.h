// The generic decoder on one GPU (the CPU twin is models/decoder_model.h): embedding; per layer, each sublayer of
// its spec in order (attention, dense MLP or MoE; model_config_check's slot rule: at most one attention and one
// MLP or MoE per layer, in either order), the block of its kind given its own sublayer spec; final norm and the
// LM head. Each sublayer is pre-norm + residual, the residual add fused into the next sublayer's (or the final)
// RMSNorm. What the kernels cannot run is refused by cuda_model_unsupported_reason. BF16 parameters and
// activations, FP32 gradients, every op a CUDA kernel or cuBLASLt GEMM queued on the device's stream.
// Nothing in the layer loop waits for the GPU: expert token counts stay on the device, the losses are
// returned as device scalars, read after the optimizer step's single sync.
//
// Activation memory follows a recompute policy (train.recompute):
//   none       keep every tensor the backward needs
//   selective  drop the cheap ones (input norms, QK-norm+RoPE outputs, the gathered expert inputs, the
//              SwiGLU output) and recompute them in the backward; keep GEMM and attention outputs
//   full       keep only each layer's input and rerun the layer's sublayers before its backward
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/phase_timer.h"
#include "layers/cuda/expert_parallel_cuda.h"
#include "layers/cuda/expert_wgrad_passes.h"
#include "models/cuda/cuda_batch.h"
#include "models/param_residency.h"
#include "models/spec/decoder_spec.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"
#include "train/memory_plan.h"

namespace mt {

// Why the CUDA model cannot run `cfg` ("" when it can), over every sublayer configuration a layer uses: a head_dim
// the flash-attention kernels lack, expert/hidden/intermediate sizes that are not multiples of 8.
std::string cuda_model_unsupported_reason(const DecoderSpec& cfg);

struct CudaModelOptions {
  Recompute recompute = Recompute::selective;
  // Rows per chunk of the fused LM head + cross-entropy (train/memory_plan.cpp counts the same). Each chunk
  // adds its dW into the fp32 [V, H] gradient (1.2 GB read + written at Qwen3's 151,936 × 2048): one chunk
  // per 4096-token micro-batch instead of four took the standard step's head + loss from 92 to 84 ms, for
  // +0.9 GB of logits.
  int64_t loss_chunk_rows = 4096;
  // Reduce the expert weight gradients of two consecutive forward_backward calls in one dW pass
  // (layers/cuda/expert_wgrad_passes.h). The caller must then call flush_expert_grads() after the last
  // micro-batch of a step, before reading the gradients.
  bool pair_expert_wgrad = false;
  // Expert parallelism: the stacked expert weights (and their gradients) hold this rank's experts only,
  // [E/ep, ...], and every MoE layer dispatches its rows over the group. Null: all experts here.
  const CudaExpertParallel* expert_parallel = nullptr;
  // ZeRO-3 (models/param_residency.h): the model fetches each group of parameters before reading it (and
  // prefetches the next one), and releases it after. Null: every parameter is always here.
  ParamResidency* residency = nullptr;
  // Every reduction in a fixed order, so a run repeats bit for bit (train.deterministic): today that is
  // flash attention's backward (FlashBwdMode::deterministic); every other kernel already sums in a fixed order.
  bool deterministic = false;
  // A LoRA adapter's bf16 working copies on the device (models/cuda/cuda_lora.h CudaLora::working(): A' = bf16(A),
  // B' = bf16(s·B)), run at every adapted slot (kernels/cuda/lora.h). It must outlive the model. Not with expert
  // parallelism or sharded parameters. Null: none.
  const LoraWeights* lora = nullptr;
  // Per decoder layer, I32 [E] on the model's device (undefined for a layer without MoE; train/expert_load.h):
  // forward_backward adds each MoE layer's routed slots per expert (from the block's route.index: this rank's tokens,
  // global expert ids, also under expert parallelism). Neither forward() nor a recompute counts. Null: none.
  std::vector<Tensor>* expert_load = nullptr;
};

// Device scalars of one micro-batch; read them (cuda::to_host) after the step's sync.
struct CudaLoss {
  Tensor ce_sum;  // F32 [1]: Σ cross-entropy over the valid targets
  Tensor count;   // I32 [1]: valid targets
  Tensor aux;     // F32 [1]: load-balancing loss, undefined when the config does not add it
};

class DecoderCudaModel {
 public:
  // weights: BF16 on cuda:device (checked). An attention sublayer runs layers/cuda/attention_block_cuda.h, a MoE
  // one layers/cuda/moe_block_cuda.h, a dense MLP one (mlp_only_layers, decoder_sparse_step, a dense Qwen3)
  // layers/cuda/mlp_block_cuda.h.
  DecoderCudaModel(const DecoderSpec& cfg, ModelWeights& weights, int device,
                    const CudaModelOptions& options = {});

  CudaLoss forward(const CudaBatch& b);
  // A forward that keeps what a comparison with another implementation needs (tests, diagnostics; it holds
  // every layer's activations until it returns): the final norm's output, BF16 [T, H], what the LM head reads
  // (logits = final_hidden · lm_headᵀ; the loss never materialises them), and per layer the selected
  // experts, I32 [T, k] by descending probability (undefined for a layer without MoE), all on the device.
  struct Trace {
    Tensor final_hidden;
    std::vector<Tensor> routes;
  };
  Trace forward_trace(const CudaBatch& b);
  // Adds d(loss)/d(param) into grads (F32 on the device; the stacked expert weights' may be BF16). loss = ce_sum / ce_divisor +
  // router_aux_loss_coef · aux (when aux_enabled()). Needs targets.
  CudaLoss forward_backward(const CudaBatch& b, ModelWeights& grads, double ce_divisor);
  // With the LoRA adapter of CudaModelOptions::lora: its gradients are added into lora_grads (F32 on the device,
  // shaped like the adapter: CudaLora::zero_grads), and `grads` may leave parameters undefined: those are frozen,
  // and their weight gradients are not computed (lora_base_grads; the input gradients still flow through them).
  CudaLoss forward_backward(const CudaBatch& b, ModelWeights& grads, LoraWeights& lora_grads, double ce_divisor);

  // The next expert weight-gradient pass into `grad` (a stacked expert gradient of the tensors given to
  // forward_backward) stores instead of adding: the step marks them instead of zeroing them.
  // flush_expert_grads() zero-fills a marked gradient that no micro-batch wrote.
  void overwrite_expert_grad_next(Tensor& grad) { wgrad_passes_.overwrite_next(grad); }
  // Completes the expert weight gradients held by pair_expert_wgrad and those marked by
  // overwrite_expert_grad_next. Call after the last micro-batch of a step, before reading the gradients.
  void flush_expert_grads();

  bool aux_enabled() const { return aux_on_; }
  const DecoderSpec& config() const { return cfg_; }
  int device() const { return device_; }
  // Experts held here: E, or E/ep under expert parallelism.
  int64_t experts_held() const;
  cuda::PhaseTimer& timer() { return timer_; }

 private:
  CudaLoss forward_backward_impl(const CudaBatch& b, ModelWeights& grads, LoraWeights* lora_grads, double ce_divisor);
  DecoderSpec cfg_;
  ModelWeights& w_;
  int device_ = 0;
  CudaModelOptions opts_;
  bool aux_on_ = false;
  cuda::PhaseTimer timer_;
  ExpertWgradPasses wgrad_passes_;
};

}  // namespace mt
