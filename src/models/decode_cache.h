// What generation keeps between steps, one entry per (layer, sublayer) that carries state, so each new token
// runs once instead of re-running the whole sequence. A GQA attention sublayer keeps its keys and values
// (layers/attention_block_cached.h), each with its own shape; an MLA sublayer keeps its compressed latent and its
// rope key (layers/mla_attention_block_cached.h); MLP and MoE sublayers keep nothing, so a layer without attention
// holds no entry. Mamba2 (a conv window + the SSM state) has no cached block yet: create() refuses it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "layers/attention_block_cached.h"
#include "layers/mla_attention_block_cached.h"
#include "models/spec/decoder_spec.h"

namespace mt {

struct DecodeCacheEntry {
  int64_t layer = 0;
  size_t sublayer = 0;  // position in spec.layers[layer].sublayers
  SublayerKind kind = SublayerKind::attention;
  AttentionCache attention;  // kind == attention, a GQA spec
  MlaCache mla;              // kind == attention, an MLA spec

  int64_t bytes() const { return attention.bytes() + mla.bytes(); }
};

struct DecodeCache {
  int64_t capacity = 0;  // positions it can hold
  int64_t length = 0;    // positions 0..length-1 are filled
  std::vector<DecodeCacheEntry> entries;  // in execution order

  // Zero-filled cache for `capacity` positions of a model with `spec`. mt::Error (one line) for capacity < 1 or a
  // sublayer whose state it cannot hold yet (Mamba2).
  static DecodeCache create(const DecoderSpec& spec, int64_t capacity);
  // The entry of sublayer `sublayer` of `layer`, or nullptr when that sublayer keeps nothing.
  DecodeCacheEntry* find(int64_t layer, size_t sublayer);
  int64_t bytes() const;

 private:
  std::vector<std::vector<int>> entry_of_;  // [layer][sublayer] -> index into entries, or -1
};

}  // namespace mt
