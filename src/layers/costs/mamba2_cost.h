// The Mamba2 mixer block's costs (CUDA twin: layers/cuda/mamba2_mixer_block_cuda.h; see block_cost.h).
#pragma once
#include <cstdint>

#include "layers/costs/block_cost.h"

namespace mt {

// Mamba2ActsCuda: proj (in_proj's output [T, Di + C + nh]), y (the scan's fp32 output [T, Di]) and the scan's
// chunk states are kept under none and selective; n, act [T, C], dt (fp32 [T, nh]) and g [T, Di] are dropped by
// selective. Backward: dg, dproj, the scan's fp32 dy, dact, ddt and dn, and the scan's own buffers.
BlockBytes mamba2_bytes(const Mamba2Spec& m, int64_t hidden, const BlockBatch& b);
// in_proj, out_proj, the depthwise conv and the chunked scan (at the spec's chunk length): per token and group
// C·Bᵀ over a chunk (2·chunk·N), per head the masked (C·Bᵀ)·X (2·chunk·P), its chunk-state and state-output
// products (2·P·N each).
double mamba2_flops_per_token(const Mamba2Spec& m, int64_t hidden);
// The scan's chunk states (fp32 [chunks, heads, P, N], chunks of 64 tokens) kept for its backward, as
// kernels/cuda/ssd_scan.h sizes them.
CostBytes mamba2_scan_states_bytes(const Mamba2Spec& m, int64_t tokens);

}  // namespace mt
