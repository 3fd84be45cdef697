#include "kernels/cpu/expert_bias.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::cpu {

namespace {
int64_t load_sum(const Tensor& load) {
  MT_CHECK(load.defined() && load.ndim() == 1 && load.dtype() == DType::I32 && load.device().is_cpu() &&
               load.dim(0) >= 1,
           "expert load must be a CPU I32 [E], got {}", load.defined() ? load.desc() : "undefined");
  const int32_t* c = load.data_as<int32_t>();
  int64_t sum = 0;
  for (int64_t e = 0; e < load.dim(0); ++e) {
    MT_CHECK(c[e] >= 0, "expert load: expert {} has a negative count {}", e, c[e]);
    sum += c[e];
  }
  return sum;
}
}  // namespace

void expert_bias_update(const Tensor& load, Tensor& bias, double rate) {
  const int64_t sum = load_sum(load), E = load.dim(0);
  MT_CHECK(bias.defined() && bias.dtype() == DType::F32 && bias.device().is_cpu() && bias.shape() == load.shape(),
           "expert bias must be a CPU F32 [{}], got {}", E, bias.defined() ? bias.desc() : "undefined");
  MT_CHECK(std::isfinite(rate) && rate >= 0, "expert bias update rate {} (must be finite and >= 0)", rate);
  const float g = static_cast<float>(rate);
  const int32_t* c = load.data_as<int32_t>();
  float* b = bias.data_as<float>();
  for (int64_t e = 0; e < E; ++e) {
    // sign(mean − load_e) = sign(Σ − E·load_e): exact in int64 (Σ ≤ E·2^31).
    const int64_t d = sum - E * static_cast<int64_t>(c[e]);
    if (d > 0)
      b[e] += g;
    else if (d < 0)
      b[e] -= g;
  }
}

double expert_load_max_over_mean(const Tensor& load) {
  const int64_t sum = load_sum(load);
  if (sum == 0) return 0.0;
  const int32_t* c = load.data_as<int32_t>();
  const int32_t most = *std::max_element(c, c + load.dim(0));
  return static_cast<double>(most) * static_cast<double>(load.dim(0)) / static_cast<double>(sum);
}

}  // namespace mt::cpu
