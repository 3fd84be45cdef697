// Multi-tensor AdamW on the device, torch.optim.AdamW semantics (as train/adamw.h on the CPU, op by op
// in fp32 with the same rounding, so F32 and fp32-master results equal the CPU optimizer's bit for bit):
//   g *= clip_coef;  p *= 1 - lr·wd;  m = lerp(m, g, 1-b1);  v = b2·v + (1-b2)·g·g;
//   p -= lr/(1-b1^t) · m / (sqrt(v)/sqrt(1-b2^t) + eps)
// Parameter precision, per parameter dtype:
//   F32 params: updated in place.
//   BF16 params, bf16_master = true: an fp32 master copy is updated; the param holds bf16(master) (RNE).
//   BF16 params, bf16_master = false: no master; the update runs in fp32 on the bf16 value and is stored with
//     stochastic rounding (seeded by seed, step and element index: reproducible).
// Moments are F32 or BF16 (RNE) as chosen. The step count and bias corrections live on the host; the clip
// coefficient is read from device memory, so a step queues kernels and never synchronises.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "train/adamw.h"

namespace mt::cuda {

struct CudaAdamWOptions {
  AdamWOptions hyper;
  bool bf16_master = true;
  DType moment_dtype = DType::F32;  // F32 or BF16
  uint64_t seed = 0;                // stochastic rounding
};

class CudaAdamW {
 public:
  // params: CUDA tensors (F32 or BF16) on one device, kept by pointer (they must outlive the optimizer).
  // decays(name) as in mt::AdamW (null: every parameter decays). State is allocated and zeroed (masters
  // copied from the params) on `stream`.
  // element_offsets: each parameter's first element index in the stochastic-rounding stream (empty: the
  // running count over `params`); a sharded optimizer passes the whole model's, so its rounding matches.
  CudaAdamW(std::vector<std::pair<std::string, Tensor*>> params, CudaAdamWOptions options,
            const std::function<bool(const std::string&)>& decays, cudaStream_t stream,
            const std::vector<int64_t>& element_offsets = {});

  // One step at learning rate lr. grads follow params (same shapes; F32 or BF16, same device).
  // clip_coef: F32 [1] on the device (grad_norm_clip_coef) or null for no clipping.
  void step(const std::vector<const Tensor*>& grads, double lr, const Tensor* clip_coef, cudaStream_t stream);

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t t) { step_ = t; }
  const CudaAdamWOptions& options() const { return options_; }
  // "<param>.exp_avg", "<param>.exp_avg_sq" and, with fp32 masters, "<param>.master" (device tensors).
  std::vector<std::pair<std::string, Tensor*>> named_state();
  // The state named_state lists for a parameter `name` like `param`, in its order.
  static std::vector<OptimizerStateSpec> state_specs(const std::string& name, const Tensor& param,
                                                     const CudaAdamWOptions& options);

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor exp_avg, exp_avg_sq, master;
    bool decay;
    int64_t offset;  // first element index in the whole parameter list (stochastic-rounding stream)
  };
  std::vector<Slot> slots_;
  CudaAdamWOptions options_;
  int64_t step_ = 0;
  int device_ = 0;
};

}  // namespace mt::cuda
