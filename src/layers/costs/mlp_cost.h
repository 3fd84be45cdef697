// The dense MLP block's costs (CUDA twin: layers/cuda/mlp_block_cuda.h; see block_cost.h). Also the shared
// expert of an MoE block.
#pragma once
#include <cstdint>

#include "layers/costs/block_cost.h"

namespace mt {

// MlpActsCuda: n (the normalised input), gu (the gate|up GEMM outputs [T, 2F]; up only [T, F] for an ungated
// activation), h (the activation's output [T, F]); selective recompute drops n and h. Backward: d(gu), dh, dn.
BlockBytes mlp_bytes(const MlpSpec& m, int64_t hidden, const BlockBatch& b);
// The gate, up and down GEMMs (no gate for ReLU^2).
double mlp_flops_per_token(const MlpSpec& m, int64_t hidden);
// Columns of the first GEMM's output: gate and up side by side, or up alone for an ungated activation (ReLU^2).
int64_t mlp_first_gemm_width(const MlpSpec& m);

}  // namespace mt
