#include "layers/costs/mamba2_cost.h"

namespace mt {

namespace {
// The CUDA scan's own chunk length (kernels/cuda/ssd_scan.h kSsdChunk, a fixed grid over the micro-batch's tokens;
// the spec's chunk_size only sets Transformers' and the CPU's).
constexpr CostBytes kScanChunk = 64;
CostBytes scan_chunks(int64_t tokens) { return (tokens + kScanChunk - 1) / kScanChunk; }
}  // namespace

CostBytes mamba2_scan_states_bytes(const Mamba2Spec& m, int64_t tokens) {
  return scan_chunks(tokens) * m.heads * m.head_dim * m.state * kCostF32;
}

BlockBytes mamba2_bytes(const Mamba2Spec& m, int64_t hidden, const BlockBatch& b) {
  const CostBytes T = b.tokens, H = hidden, Di = m.inner(), C = m.conv_dim(), W = m.in_proj_dim(), nh = m.heads;
  const CostBytes n = T * H * kCostBf16, proj = T * W * kCostBf16, act = T * C * kCostBf16, dt = T * nh * kCostF32,
                  y = T * Di * kCostF32, g = T * Di * kCostBf16, states = mamba2_scan_states_bytes(m, b.tokens);
  const CostBytes kept = proj + y + states, cheap = n + act + dt + g;
  BlockBytes r;
  r.saved = b.recompute == Recompute::full ? 0 : b.recompute == Recompute::selective ? kept : kept + cheap;
  r.recomputed = b.recompute == Recompute::full ? kept + cheap : b.recompute == Recompute::selective ? cheap : 0;
  // The scan's backward also takes a buffer of the states' size (their gradients) and C·Bᵀ per (chunk, group).
  const CostBytes scan = states + scan_chunks(b.tokens) * m.groups * kScanChunk * kScanChunk * kCostF32;
  r.backward = T * Di * kCostBf16 /*dg*/ + proj /*dproj*/ + y /*the scan's dy*/ + act /*dact*/ + dt /*ddt*/ + n /*dn*/ +
               scan;
  return r;
}

double mamba2_flops_per_token(const Mamba2Spec& m, int64_t hidden) {
  const double H = static_cast<double>(hidden), Di = static_cast<double>(m.inner()),
               W = static_cast<double>(m.in_proj_dim()), C = static_cast<double>(m.conv_dim()),
               K = static_cast<double>(m.conv_kernel), Q = static_cast<double>(m.chunk > 0 ? m.chunk : 128),
               nh = static_cast<double>(m.heads), P = static_cast<double>(m.head_dim),
               N = static_cast<double>(m.state), G = static_cast<double>(m.groups);
  const double gemms = 2.0 * H * W + 2.0 * Di * H, conv = 2.0 * C * K;
  const double scan = G * 2.0 * Q * N + nh * 2.0 * Q * P + nh * 4.0 * P * N;
  return gemms + conv + scan;
}

}  // namespace mt
