// The MoE block's costs (CUDA twin: layers/cuda/moe_block_cuda.h; see block_cost.h).
#pragma once
#include <cstdint>

#include "layers/costs/block_cost.h"

namespace mt {

// MoeActsCuda: n, router logits [T, E] (F32 for the sigmoid group router), the routes (index I32, weight F32 [T, k]),
// the permutation plan (offsets, row_of_slot, slot_of_row), the gathered rows xg [R, H], gu [R, 2I], h [R, I], yd
// [R, H] (R = T·k, or under the all-gather dispatch its row budget); selective recompute drops n, xg and h. Under
// expert parallelism the all-gather dispatch keeps the group's n and routing weights [ep·T, ·] (xg is re-gathered from
// them), the all_to_all dispatch keeps the received rows xg under selective recompute (not dispatched again); paired
// expert wgrads hold one micro-batch's dyd, h, dgu and xg. Backward: dyd, dh, dgu, dxg, dn, d(weights), d(logits),
// plus the dispatch's exchange buffers under expert parallelism. A shared expert adds the dense MLP block's costs.
BlockBytes moe_bytes(const MoeSpec& m, int64_t hidden, const BlockBatch& b);
// The k routed experts' MLPs and the shared expert's; the router GEMM is left out (bench's MFU convention).
double moe_flops_per_token(const MoeSpec& m, int64_t hidden);

}  // namespace mt
