// A decoder's costs as the sum of its blocks' (layers/costs/block_cost.h) over spec.layers, plus what the
// generic CUDA model's layer loop (models/cuda/decoder_cuda_model.cpp) keeps around them: the memory plan's
// per-layer activations and bench's FLOPs per token read these, for any mix of sublayers.
#pragma once
#include <cstdint>

#include "layers/costs/block_cost.h"
#include "models/spec/decoder_spec.h"

namespace mt {

// One decoder layer's activation bytes for one micro-batch.
struct LayerBytes {
  // Kept from its forward until its backward: the layer input x_in (under every policy), the residual stream
  // between consecutive sublayers (x_mid; re-created under full recompute) and each sublayer's saved bytes.
  CostBytes saved = 0;
  // Alive on top of everything saved during its backward: what the policy dropped, re-created for the whole layer
  // first, every sublayer's gradient buffers (an upper bound: they are not all alive at once) and the residual
  // stream's two gradients (dx, dx_mid).
  CostBytes backward_peak = 0;
};
LayerBytes decoder_layer_bytes(const DecoderSpec& spec, int64_t layer, const BlockBatch& b);

// The RoPE tables a batch carries: one per attention configuration the layers use (layers/costs/attention_cost.h).
CostBytes decoder_rope_table_bytes(const DecoderSpec& spec, int64_t tokens);

// Forward FLOPs per token at sequence length `seq`: every sublayer's plus the LM head's (2·V·H; the router GEMMs
// and the norms are left out).
double decoder_flops_per_token(const DecoderSpec& spec, int64_t seq);
// A training step's: 3x the forward (backward computes the input and the weight gradients).
double decoder_train_flops_per_token(const DecoderSpec& spec, int64_t seq);

}  // namespace mt
