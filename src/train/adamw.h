// AdamW with torch.optim.AdamW semantics (default single-tensor path, hf-numerics.md §1.1):
//   p *= 1 - lr*wd;  m = lerp(m, g, 1-b1);  v = b2*v + (1-b2)*g*g;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// Element math in fp32 exactly as torch orders it; bias corrections in double (Python floats).
// BF16 parameters get an fp32 master copy that the update runs on (unless master_weights is off); the
// parameter then holds bf16(master) (round to nearest even). Moments are always fp32.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mt {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // BF16 parameters: true keeps an fp32 master copy; false updates from the bf16 value itself and
  // rounds back to bf16 every step (half the state memory; small updates can vanish in rounding).
  bool master_weights = true;
};

// One optimizer-state tensor as named_state lists it: what a save lays out for a parameter whose state another
// rank keeps (train/optimizer_shards.h).
struct OptimizerStateSpec {
  std::string name;
  Shape shape;
  DType dtype;
};

// HF Trainer's rule (Trainer.get_decay_parameter_names): no weight decay for biases and
// norm weights (names containing "bias", "layernorm", "rmsnorm", "_norm." or ".norm.").
bool adamw_hf_decays(const std::string& name);

class AdamW {
 public:
  // `params` are CPU tensors of F32 or BF16, kept by pointer (they must outlive the optimizer).
  // `decays(name)` says whether weight decay applies to a parameter; null = all decay, as
  // torch.optim.AdamW(model.parameters()) does.
  AdamW(std::vector<std::pair<std::string, Tensor*>> params, AdamWOptions options,
        const std::function<bool(const std::string&)>& decays = nullptr);

  // One step at learning rate `lr` (a scheduler's value). `grads` follow the order of `params`,
  // same shapes, F32 or BF16. Throws mt::Error on a count, shape or dtype mismatch, before
  // touching any state.
  void step(const std::vector<const Tensor*>& grads, double lr);

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t t) { step_ = t; }  // when restoring a checkpoint
  const AdamWOptions& options() const { return options_; }

  // Optimizer state for checkpointing: "<param>.exp_avg", "<param>.exp_avg_sq" and, for BF16
  // parameters, "<param>.master" (all F32). Writable, so a restore can copy into them.
  std::vector<std::pair<std::string, Tensor*>> named_state();
  // The state named_state lists for a parameter `name` like `param`, in its order.
  static std::vector<OptimizerStateSpec> state_specs(const std::string& name, const Tensor& param,
                                                     const AdamWOptions& options);

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor exp_avg;
    Tensor exp_avg_sq;
    Tensor master;  // defined only for BF16 params
    bool decay;
  };
  std::vector<Slot> slots_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace mt
