// Expert weight gradients of two micro-batches in one dW pass. The grouped wgrad is bound by its dW
// read-add-write (bench/NOTES.md), so instead of one pass per micro-batch, a micro-batch's (dy, x,
// offsets) is held until the next micro-batch's arrives and both are reduced together
// (grouped_gemm_wgrad2); flush() runs whatever is still held (an odd count, the step's end). Holding costs
// one micro-batch's expert activations per layer (the memory plan counts them).
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt {

class ExpertWgradPairing {
 public:
  enum Which { down = 0, gate_up = 1 };
  void resize(int64_t layers) { held_.resize(static_cast<size_t>(layers)); }
  // dw (+)= dyᵀ·x per expert (grouped layout `offsets`), paired with the held micro-batch of the same
  // (layer, which) when there is one, else held. dw must stay the same tensor until flush().
  void add(int64_t layer, Which which, const Tensor& dy, const Tensor& x, const Tensor& offsets, Tensor& dw,
           cudaStream_t stream);
  void flush(cudaStream_t stream);
  bool empty() const;

 private:
  struct Held {
    Tensor dy, x, offsets;
    Tensor* dw = nullptr;
  };
  std::vector<std::array<Held, 2>> held_;
};

}  // namespace mt
