// A LoRA adapter (models/lora_adapter.h) on one GPU: the fp32 masters, which AdamW updates and checkpoints save (as
// PEFT keeps adapters in fp32 over a bf16 base), and the bf16 working copies the GEMMs read (kernels/cuda/lora.h:
// A' = bf16(A), B' = bf16(s·B)), made again from the masters after every optimizer step (refresh). The copies cost
// 2 bytes per adapter parameter next to the masters' 4, gradients' 4 and AdamW moments' 8.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "models/lora_adapter.h"

namespace mt {

class CudaLora {
 public:
  // Uploads `host` (F32 on the CPU, e.g. LoraWeights::init or a loaded adapter) to cuda:device and makes the
  // working copies, on the device's stream.
  CudaLora(const LoraWeights& host, int device);

  LoraWeights& masters() { return masters_; }  // F32 on the device, table order
  const LoraWeights& masters() const { return masters_; }
  const LoraWeights& working() const { return working_; }  // BF16 on the device: CudaModelOptions::lora
  // Zero F32 gradient buffers on the device, shaped like the adapter.
  LoraWeights zero_grads() const;
  // The working copies from the masters (after each optimizer step; queued on the device's stream).
  void refresh();
  // The masters into `host` (F32 on the CPU, the same table); waits for the device.
  void to_host(LoraWeights& host) const;
  int device() const { return device_; }
  // Bytes on the device: masters + working copies.
  int64_t bytes() const;

 private:
  int device_ = 0;
  LoraWeights masters_, working_;
};

}  // namespace mt
