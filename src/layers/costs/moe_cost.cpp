#include "layers/costs/moe_cost.h"

#include <cmath>

#include "layers/costs/mlp_cost.h"

namespace mt {

BlockBytes moe_bytes(const MoeSpec& m, int64_t hidden, const BlockBatch& b) {
  const CostBytes T = b.tokens, H = hidden, E = m.num_experts, k = m.experts_per_token, I = m.expert.intermediate_size;
  const CostBytes Tk = T * k, G = mlp_first_gemm_width(m.expert);
  const CostBytes ep = b.expert_parallel > 1 ? b.expert_parallel : 1;
  const bool gathers = ep > 1 && b.ep_all_gather;
  // Rows of this rank's expert buffers: T·k, or the all-gather dispatch's budget (the even share times the headroom).
  CostBytes R = Tk;
  if (gathers && b.ep_row_headroom > 1)
    R = static_cast<CostBytes>(std::ceil(static_cast<double>(Tk) * b.ep_row_headroom));

  // The sigmoid group router's logits are F32 (its d(logits) stays BF16).
  const CostBytes logits = T * E * (m.router.score == RouterScore::sigmoid_group ? kCostF32 : kCostBf16);
  const CostBytes n = T * H * kCostBf16, dlogits = T * E * kCostBf16;
  const CostBytes route = Tk * kCostI32 + Tk * kCostF32;                 // index, weight
  const CostBytes plan = (E + 1) * kCostI32 + Tk * kCostI32 + Tk * kCostI32;  // offsets, row_of_slot, slot_of_row
  const CostBytes xg = R * H * kCostBf16, gu = R * G * kCostBf16, h = R * I * kCostBf16, yd = R * H * kCostBf16;
  const CostBytes kept = logits + route + plan + gu + yd, cheap = n + xg + h;
  BlockBytes r;
  r.saved = b.recompute == Recompute::full ? 0 : b.recompute == Recompute::selective ? kept : kept + cheap;
  r.recomputed = b.recompute == Recompute::full ? kept + cheap : b.recompute == Recompute::selective ? cheap : 0;
  // NOTE: what expert parallelism keeps is not in `recomputed`: the all_to_all rows xg stay (counted in `cheap`
  // above as well, an over-count), and under full recompute the all-gather's n and weights [ep·T, ·] are gathered
  // again before the backward (not counted). The plan has always counted them so.
  if (gathers && b.recompute != Recompute::full)  // the gathered n_all [ep·T, H] and routing weights F32 [ep·T, k]
    r.saved += ep * T * (H * kCostBf16 + k * kCostF32);
  else if (ep > 1 && b.recompute == Recompute::selective)  // the received rows xg [T·k, H], not dispatched again
    r.saved += Tk * H * kCostBf16;
  if (b.pair_expert_wgrad)  // held until the next micro-batch's pass: dyd [R, H], h [R, I], dgu [R, 2I], xg [R, H]
    r.saved += R * (2 * H + I + G) * kCostBf16;
  r.backward = R * H * kCostBf16 /*dyd*/ + R * I * kCostBf16 /*dh*/ + R * G * kCostBf16 /*dgu*/ +
               R * H * kCostBf16 /*dxg*/ + n /*dn*/ + Tk * kCostF32 /*d(weights)*/ + dlogits /*d(logits)*/;
  // Under expert parallelism: the gathered output gradient and the input gradient's partial sums [ep·T, H] each
  // (all_gather), or the source-major copy of a dispatch [T·k, H] (all_to_all).
  if (gathers)
    r.backward += 2 * ep * T * H * kCostBf16;
  else if (ep > 1)
    r.backward += Tk * H * kCostBf16;
  if (m.shared_expert) {  // the dense MLP block on the same normalised input (its n is the block's: counted twice)
    const BlockBytes s = mlp_bytes(*m.shared_expert, hidden, b);
    r.saved += s.saved;
    r.recomputed += s.recomputed;
    r.backward += s.backward;
  }
  return r;
}

double moe_flops_per_token(const MoeSpec& m, int64_t hidden) {
  double f = static_cast<double>(m.experts_per_token) * mlp_flops_per_token(m.expert, hidden);
  if (m.shared_expert) f += mlp_flops_per_token(*m.shared_expert, hidden);
  return f;
}

}  // namespace mt
