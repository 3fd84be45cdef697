#include "layers/costs/mlp_cost.h"

namespace mt {

int64_t mlp_first_gemm_width(const MlpSpec& m) {
  return m.activation == Activation::relu2 ? m.intermediate_size : 2 * m.intermediate_size;
}

BlockBytes mlp_bytes(const MlpSpec& m, int64_t hidden, const BlockBatch& b) {
  const CostBytes T = b.tokens, H = hidden, F = m.intermediate_size;
  const CostBytes n = T * H * kCostBf16, gu = T * mlp_first_gemm_width(m) * kCostBf16, h = T * F * kCostBf16;
  BlockBytes r;
  r.saved = b.recompute == Recompute::full ? 0 : b.recompute == Recompute::selective ? gu : gu + n + h;
  r.recomputed = b.recompute == Recompute::full ? gu + n + h : b.recompute == Recompute::selective ? n + h : 0;
  r.backward = gu /*d(gu)*/ + h /*dh*/ + n /*dn*/;
  return r;
}

double mlp_flops_per_token(const MlpSpec& m, int64_t hidden) {
  const double H = static_cast<double>(hidden);
  return 2.0 * H * static_cast<double>(mlp_first_gemm_width(m) + m.intermediate_size);
}

}  // namespace mt
