#include "kernels/cpu/swiglu_oai.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

void swiglu_oai_forward_rows(int64_t rows, int64_t F, const float* g, const float* u, int64_t ld_in, float* a,
                             int64_t ld_out, bool bf16) {
  auto r = [bf16](float x) { return bf16 ? round_bf16(x) : x; };
#pragma omp parallel for schedule(static) if ((rows * F) >= kParallelMinWork)
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < F; ++i) {
      const float gc = std::min(g[row * ld_in + i], kSwigluOaiLimit);
      const float uc = std::clamp(u[row * ld_in + i], -kSwigluOaiLimit, kSwigluOaiLimit);
      const float z = r(gc * kSwigluOaiAlpha);
      const float glu = r(gc * r(1.0f / (1.0f + std::exp(-z))));
      a[row * ld_out + i] = r(r(uc + 1.0f) * glu);
    }
  }
}

void swiglu_oai_backward_rows(int64_t rows, int64_t F, const float* da, int64_t ld_da, const float* g,
                              const float* u, int64_t ld_in, float* dg, float* du, int64_t ld_out) {
#pragma omp parallel for schedule(static) if ((rows * F) >= kParallelMinWork)
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < F; ++i) {
      const float x = g[row * ld_in + i], y = u[row * ld_in + i];
      const float gc = std::min(x, kSwigluOaiLimit);
      const float uc = std::clamp(y, -kSwigluOaiLimit, kSwigluOaiLimit);
      const float s = 1.0f / (1.0f + std::exp(-kSwigluOaiAlpha * gc));
      const float glu = gc * s;
      const float d = da[row * ld_da + i];
      // d glu / d g' = s + α·g'·s·(1 − s)
      dg[row * ld_out + i] = x <= kSwigluOaiLimit ? d * (uc + 1.0f) * (s + kSwigluOaiAlpha * gc * s * (1.0f - s)) : 0.0f;
      du[row * ld_out + i] = (y >= -kSwigluOaiLimit && y <= kSwigluOaiLimit) ? d * glu : 0.0f;
    }
  }
}

}  // namespace mt::cpu
