// What one block costs on the GPU, from its sublayer spec and the batch geometry alone (no CUDA, no tensors):
// the activation bytes its CUDA twin (layers/cuda/*_block_cuda.cpp) keeps from forward to backward under a
// recompute policy, what its backward re-creates and allocates on top, and its forward FLOPs per token. The
// memory plan (train/memory_plan) and bench's FLOPs (models/decoder_costs) sum these over spec.layers, so a new
// block kind brings its cost file and nothing that adds up a model changes.
//
// The costs live beside the blocks, under layers/, in plain C++: `bench --plan-only` and `inspect` run in CPU
// builds, where the CUDA blocks are not compiled.
#pragma once
#include <cstdint>

#include "models/spec/decoder_spec.h"

namespace mt {

// What forward keeps for backward (train.recompute): everything (none), all but the cheap tensors (selective:
// norms, RoPE, activations, gathers redone in backward) or only each layer's input (full: the layer's forward
// runs again before its backward).
enum class Recompute { none, selective, full };

// Byte counts as 128-bit integers: a block's largest term is about 2^72 bytes for dimensions <= 2^31 and
// 2^40 tokens, so nothing overflows (the memory plan clamps its totals).
using CostBytes = __int128;

inline constexpr CostBytes kCostBf16 = 2, kCostF32 = 4, kCostI32 = 4, kCostI64 = 8;

// One micro-batch as a block sees it.
struct BlockBatch {
  int64_t tokens = 0;  // T: micro_batch x seq
  Recompute recompute = Recompute::selective;
  // Attention: flash attention's deterministic backward (train.deterministic) keeps dK/dV per query head.
  bool deterministic = false;
  // MoE under expert parallelism over this many ranks (1: none), see layers/cuda/moe_block_cuda.h.
  int64_t expert_parallel = 1;
  bool ep_all_gather = false;   // the all-gather dispatch (else the per-slot all_to_all)
  double ep_row_headroom = 0;   // the all-gather row budget's headroom over the even share (> 1: applied)
  bool pair_expert_wgrad = false;  // expert wgrads of two micro-batches in one pass (expert_wgrad_passes.h)
};

// The bytes of one block for one micro-batch under BlockBatch::recompute.
struct BlockBytes {
  CostBytes saved = 0;       // kept from its forward until its backward
  CostBytes recomputed = 0;  // re-created just before its backward (what the policy dropped), alive through it
  CostBytes backward = 0;    // its backward's working buffers (gradients of its activations)
};

// The costs of sublayer `s` of `spec` (switching on its kind); `layer` names it in errors.
BlockBytes sublayer_bytes(const DecoderSpec& spec, int64_t layer, const Sublayer& s, const BlockBatch& b);
// Forward FLOPs per token of sublayer `s` at sequence length `seq` (multiply-adds count 2; the training step is
// 3x this: backward computes the input and the weight gradients).
double sublayer_flops_per_token(const DecoderSpec& spec, int64_t layer, const Sublayer& s, int64_t seq);

}  // namespace mt
