// The expert weight-gradient passes of a training step. Each grouped wgrad pass reads, adds and writes the
// whole dW (a pass with no dW reads runs 7-30% faster: bench/NOTES.md 35), so this object keeps that traffic
// down in two ways:
// - Pairing (when on): instead of one pass per micro-batch, a micro-batch's (dy, x, offsets) is held until the
//   next micro-batch's arrives and both are reduced in one pass (grouped_gemm_wgrad2); flush() runs whatever
//   is still held (an odd count, the step's end). Holding costs one micro-batch's expert activations per
//   layer (the memory plan counts them).
// - First pass overwrites: a gradient marked with overwrite_next() (the step does this instead of zeroing
//   the expert gradients) gets its first pass as a store, not a read-add-write; flush() zero-fills a
//   marked gradient that no pass wrote.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt {

class ExpertWgradPasses {
 public:
  enum Which { down = 0, gate_up = 1 };
  void resize(int64_t layers) { held_.resize(static_cast<size_t>(layers)); }
  void set_pairing(bool on) { pair_ = on; }
  // The next pass into dw stores instead of adding (its current contents are garbage to this step). dw must
  // outlive the next flush(). Marking a marked tensor again changes nothing (a step that failed before its
  // flush must not leave two marks, which would make the next step's second pass store too).
  void overwrite_next(Tensor& dw);
  // dw (+)= dyᵀ·x per expert (grouped layout `offsets`). With pairing: paired with the held micro-batch of
  // the same (layer, which) when there is one, else held; dw must stay the same tensor until flush().
  void add(int64_t layer, Which which, const Tensor& dy, const Tensor& x, const Tensor& offsets, Tensor& dw,
           cudaStream_t stream);
  // Runs the held passes, then zero-fills the marked gradients no pass has written.
  void flush(cudaStream_t stream);
  bool empty() const;

 private:
  struct Held {
    Tensor dy, x, offsets;
    Tensor* dw = nullptr;
  };
  // Whether dw's next pass must add (false: it is marked; the mark is consumed).
  bool accumulate_into(const Tensor& dw);

  std::vector<std::array<Held, 2>> held_;
  std::vector<Tensor*> fresh_;  // marked by overwrite_next, not written yet
  bool pair_ = false;
};

}  // namespace mt
