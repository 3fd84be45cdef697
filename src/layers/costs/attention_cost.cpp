#include "layers/costs/attention_cost.h"

#include <algorithm>

#include "core/error.h"

namespace mt {

BlockBytes attention_bytes(const AttentionSpec& a, int64_t hidden, const BlockBatch& b) {
  MT_CHECK(a.kind == AttentionKind::gqa, "attention cost: only GQA attention has a CUDA block");
  const CostBytes T = b.tokens, H = hidden, Hq = a.heads, Hkv = a.kv_heads, D = a.head_dim, Dv = a.value_dim();
  // Heads of flash's fp32 dK/dV sums: the deterministic backward keeps every query head's, summed in order after.
  const CostBytes flash_kv_heads = b.deterministic ? Hq : Hkv;
  const CostBytes th = T * H * kCostBf16;
  const CostBytes q = T * Hq * D * kCostBf16, k = T * Hkv * D * kCostBf16, v = T * Hkv * Dv * kCostBf16;
  const CostBytes o = T * Hq * Dv * kCostBf16, lse = Hq * T * kCostF32;
  const CostBytes kept = q + k + v + o + lse;
  const CostBytes cheap = th /*a*/ + q /*qr*/ + k /*kr*/;
  BlockBytes r;
  r.saved = b.recompute == Recompute::full ? 0 : b.recompute == Recompute::selective ? kept : kept + cheap;
  r.recomputed = b.recompute == Recompute::full ? kept + cheap : b.recompute == Recompute::selective ? cheap : 0;
  const CostBytes flash = (Hq * D + flash_kv_heads * (D + Dv)) * T * kCostF32 + Hq * T * kCostF32;  // dq dk dv, delta
  r.backward = o /*d(o)*/ + flash + q + k + v /*dq dk dv*/ + q + k /*after RoPE*/ + q + k /*before QK-norm*/ +
               th /*da*/;
  return r;
}

double attention_flops_per_token(const AttentionSpec& a, int64_t hidden, int64_t seq) {
  MT_CHECK(a.kind == AttentionKind::gqa, "attention cost: only GQA attention has a CUDA block");
  const double H = static_cast<double>(hidden), Hq = static_cast<double>(a.heads),
               Hkv = static_cast<double>(a.kv_heads), D = static_cast<double>(a.head_dim),
               Dv = static_cast<double>(a.value_dim());
  const double projections = H * Hq * D + H * Hkv * D + H * Hkv * Dv + Hq * Dv * H;
  // Keys a query meets, summed over the S queries of a row, per token: causal S²/2 / S = S/2; a window of W keys
  // removes the (S - W)²/2 beyond it.
  const double S = static_cast<double>(seq);
  double pairs = S * S / 2;
  if (a.sliding_window > 0 && a.sliding_window < seq) {
    const double beyond = S - static_cast<double>(a.sliding_window);
    pairs -= beyond * beyond / 2;
  }
  return 2.0 * projections + 2.0 * (pairs / S) * Hq * (D + Dv);
}

CostBytes attention_rope_table_bytes(const AttentionSpec& a, int64_t tokens) {
  if (a.rope.kind == RopeKind::none) return 0;
  const CostBytes rotated = a.rope.rotary_dim > 0 ? a.rope.rotary_dim : a.head_dim;
  return 2 * CostBytes{tokens} * (rotated / 2) * kCostF32;
}

}  // namespace mt
