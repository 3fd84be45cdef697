// The generic decoder on the CPU reference backend: embedding, then per layer each sublayer of the spec
// (attention, dense MLP, MoE, Mamba2; pre-norm + residual inside each block of src/layers), final norm and LM head;
// forward, loss and an explicit backward over the same blocks (no general autograd). Numerics follow Transformers 5.17:
// plain fp32 for F32 parameters, the bf16 rounding points of hf-numerics.md §1.1 for BF16 parameters.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "models/spec/decoder_spec.h"
#include "models/model_weights.h"

namespace mt {

struct Batch {
  Tensor input_ids;     // I64 [B, S]
  Tensor labels;        // I64 [B, S] (unshifted, -100 = ignore) or undefined
  Tensor position_ids;  // I64 [B, S] or undefined => 0..S-1 per row. A new packed document starts
                        // wherever a position is not the previous one + 1 (HF find_packed_sequence_indices).
  // In a multi-rank job: every rank runs a micro-batch of this token count at this point of the step (the
  // last micro-batches of an epoch may be shorter on some ranks). The GPU's all-gather expert dispatch
  // needs it; without it the per-slot dispatch runs.
  bool uniform_across_ranks = true;
};

// Throws on a spec the CPU engine cannot run (head counts, sizes, sublayer options it has no kernels for).
void model_config_check(const DecoderSpec& cfg);
// Checks every parameter's presence, shape, dtype and device against cfg; `what` ("parameter",
// "gradient") names the tensors in the error.
// experts_held >= 0: the stacked expert tensors hold that many experts (an expert-parallel slice).
// frozen_allowed: an undefined tensor is a frozen parameter's (absent) gradient, not an error.
void weights_check(const DecoderSpec& cfg, const ModelWeights& w, const char* what, DType dtype, Device device,
                   int64_t experts_held = -1, bool frozen_allowed = false);

// Checks input_ids (I64 [B, S], ids inside the vocabulary), labels and position_ids (like input_ids);
// throws a one-line mt::Error naming the field.
void batch_validate(const DecoderSpec& cfg, const Batch& b);
// position_ids, or 0..S-1 per row when undefined.
Tensor batch_positions(const Batch& b);
// I32 [B, S] document index per token when position_ids restart inside a row (packed documents), else
// undefined (every row is one causal sequence).
Tensor batch_document_ids(const Batch& b);

struct LossOptions {
  double ce_divisor = 0;  // > 0: CE sum / ce_divisor (Trainer's num_items_in_batch); else mean over valid tokens
};

struct ForwardResult {
  double loss = 0, ce_loss = 0, aux_loss = 0;
  int64_t tokens = 0;  // valid shifted labels
  Tensor logits;       // F32 [B, S, V] if requested
};

struct ExpertParallel;  // layers/expert_parallel.h
class ParamResidency;   // models/param_residency.h
struct LoraWeights;     // models/lora_adapter.h
struct LayerLora;

struct ModelOptions {
  // Packed documents (position_ids restarting) attend only within themselves, as HF's
  // find_packed_sequence_indices mask and flash-attention varlen do. NOTE: HF 5.17 with sdpa builds
  // that mask only when no cache exists (use_cache=False, as tests/fixtures/qwen3_moe was made); with
  // config use_cache = true (the default) it gets a DynamicCache and plain causal attention across
  // documents (RoPE still uses the restarted positions). false reproduces that behaviour.
  bool packed_document_mask = true;
  // Expert parallelism (layers/expert_parallel.h): the MoE experts run on the ranks that own them, and the
  // stacked expert parameters and gradients hold this rank's experts only. Every rank of the group must then
  // run the same forward/backward calls. Null: all experts run here.
  const ExpertParallel* expert_parallel = nullptr;
  // Sharded parameters (ZeRO-3): each group of parameters is fetched before the model reads it and released
  // after. Null: every parameter is present all the time.
  ParamResidency* residency = nullptr;
  // A LoRA adapter (models/lora_adapter.h) on the adapted slots: y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ there. It must outlive the
  // model. Not with expert parallelism or sharded parameters (the trainer refuses those first). Null: none.
  const LoraWeights* lora = nullptr;
  // Per decoder layer, I32 [E] on the CPU (undefined for a layer without MoE; train/expert_load.h): forward_backward
  // adds each MoE layer's routed slots per expert (this process's tokens, over all E experts also under expert
  // parallelism). forward() does not count (evaluation). Null: nothing counted.
  std::vector<Tensor>* expert_load = nullptr;
};

class DecoderModel {
 public:
  // Checks every parameter's shape and dtype (all F32 or all BF16) against cfg; throws mt::Error.
  DecoderModel(const DecoderSpec& cfg, ModelWeights& weights, const ModelOptions& opts = {});

  // loss = ce_loss + aux_loss_coef · aux_loss when cfg.aux_loss_on() (a MoE layer asks for the
  // load-balancing loss), else ce_loss. Without labels the losses are 0. With no valid label the CE is 0 (HF's
  // mean would be NaN; with a ce_divisor it is 0 as here).
  ForwardResult forward(const Batch& b, bool want_logits, const LossOptions& o = {});
  // Adds d(loss)/d(param) into grads (F32, shaped like the params: ModelWeights::zeros_like_config).
  // Needs labels.
  ForwardResult forward_backward(const Batch& b, ModelWeights& grads, const LossOptions& o = {});
  // With the LoRA adapter of ModelOptions::lora: its gradients are added into lora_grads (F32, shaped like it:
  // LoraWeights::zeros), and `grads` may leave parameters undefined: those are frozen, and their gradients are
  // not computed (lora_base_grads: all but the ones trained in full).
  ForwardResult forward_backward(const Batch& b, ModelWeights& grads, LoraWeights& lora_grads,
                                 const LossOptions& o = {});

  const DecoderSpec& config() const { return cfg_; }
  bool bf16() const { return bf16_; }

 private:
  ForwardResult forward_backward_impl(const Batch& b, ModelWeights& grads, LoraWeights* lora_grads,
                                      const LossOptions& o);
  const LayerLora* layer_lora(int64_t l) const;
  void fetch(int64_t group) const;
  void release(int64_t group, bool backward_follows) const;
  DecoderSpec cfg_;
  ModelWeights& w_;
  ModelOptions opts_;
  bool bf16_ = false;
};

}  // namespace mt
