// What every CUDA decoder block of a micro-batch shares: the config, the uploaded batch (RoPE tables,
// document ranges), the stream and the phase timer. Activations are BF16 [T, ·] on the device.
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/cuda/lora.h"
#include "kernels/cuda/phase_timer.h"
#include "models/cuda/cuda_batch.h"
#include "models/lora_adapter.h"
#include "models/spec/decoder_spec.h"

namespace mt {

class CudaExpertParallel;

struct CudaBlockEnv {
  const DecoderSpec* cfg = nullptr;
  const CudaBatch* batch = nullptr;
  int device = 0;
  cudaStream_t stream = nullptr;
  cuda::PhaseTimer* timer = nullptr;  // never null (a disabled timer records nothing)
  const CudaExpertParallel* ep = nullptr;  // expert parallelism (layers/cuda/expert_parallel_cuda.h), or none
  int64_t layer = -1;                      // the decoder layer being run (named in collective errors)
  // The all-gather expert dispatch may run for this micro-batch (every rank has one of the same token
  // count, CudaBatch::uniform_across_ranks); else the per-slot all_to_all, which takes any count.
  bool ep_gather = true;
  bool deterministic = false;  // CudaModelOptions::deterministic
  // This layer's LoRA adapter (models/cuda/cuda_lora.h): its bf16 working copies (B' = bf16(s·B)) and, in a
  // backward, its fp32 gradients. Null: no adapter (or no gradients wanted).
  const LayerLora* lora_layer = nullptr;
  LayerLora* dlora_layer = nullptr;

  int64_t tokens() const { return batch->tokens(); }
  float eps() const { return static_cast<float>(cfg->norm_eps); }
  // Every RMSNorm of the model rounds once in bf16 (GPT-OSS) rather than twice (NormRounding).
  bool norm_round_once() const { return cfg->norm_rounding == NormRounding::gpt_oss; }
  Device dev() const { return Device::cuda(device); }
  Tensor bf16(const Shape& s) const { return Tensor::empty(s, DType::BF16, dev()); }
  void phase(cuda::Phase p) const { timer->mark(p, stream); }
  // The adapter on weight slot `slot` (WeightSlot) of this layer: off when there is none.
  cuda::LoraOperands lora(int slot) const {
    const LoraPair* p = lora_layer ? lora_layer->at(slot) : nullptr;
    if (!p || !p->on()) return {};
    return {&p->a, &p->b, lora_layer->scale};
  }
  cuda::LoraGrads dlora(int slot) const {
    LoraPair* p = dlora_layer ? dlora_layer->at(slot) : nullptr;
    if (!p || !p->on()) return {};
    return {&p->a, &p->b};
  }
  // y (slot's base projection output, x its input) += the slot's adapter, if any; returns its u (kernels/cuda/lora.h),
  // which the backward reads, or an undefined tensor without an adapter.
  Tensor lora_forward(int slot, const Tensor& x, Tensor& y) const {
    const cuda::LoraOperands l = lora(slot);
    return l.on() ? cuda::lora_forward(x, l, y, stream) : Tensor();
  }
  // dx (the base projection's input gradient) += the slot's adapter's, and its A/B gradients into dlora, if it has one.
  void lora_backward(int slot, const Tensor& dy, const Tensor& x, const Tensor& u, Tensor& dx) const {
    const cuda::LoraOperands l = lora(slot);
    if (l.on()) cuda::lora_backward(dy, x, u, l, dx, dlora(slot), stream);
  }
};

}  // namespace mt
