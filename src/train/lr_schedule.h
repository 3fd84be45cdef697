// Learning-rate schedules as the HF Trainer applies them (transformers.optimization):
// the optimizer step that follows `completed` finished steps uses lr = peak · factor(completed),
// so with warmup the very first step runs at lr 0, exactly as HF's LambdaLR does.
//   warmup (completed < W):  factor = completed / W
//   constant:                factor = 1
//   linear:                  factor = max(0, (N - completed) / (N - W)), then floored at min_lr_ratio
//   cosine:                  factor = 0.5 · (1 + cos(π · progress)), progress = (completed - W) / (N - W),
//                            mapped to min_lr_ratio + (1 - min_lr_ratio) · factor
//                            (get_cosine_with_min_lr_schedule_with_warmup; min 0 = the plain cosine)
#pragma once
#include <cstdint>
#include <string>

namespace mt {

struct LrSchedule {
  std::string name = "constant";  // constant | linear | cosine
  double peak_lr = 1e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;  // N: the planned number of optimizer steps
  double min_lr_ratio = 0;
};

// Learning rate of the optimizer step that follows `completed` finished steps.
double lr_at(const LrSchedule& s, int64_t completed);

}  // namespace mt
