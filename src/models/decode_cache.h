// What generation keeps between steps, one entry per (layer, sublayer) that carries state, so each new token
// runs once instead of re-running the whole sequence. A GQA attention sublayer keeps its keys and values
// (layers/attention_block_cached.h), each with its own shape; an MLA sublayer keeps its compressed latent and its
// rope key (layers/mla_attention_block_cached.h); a Mamba2 sublayer keeps its conv window and its SSM state
// (layers/mamba2_mixer_block_cached.h), whose size does not depend on the capacity; MLP and MoE sublayers keep
// nothing, so a layer with neither attention nor Mamba2 holds no entry.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "layers/attention_block_cached.h"
#include "layers/mamba2_mixer_block_cached.h"
#include "layers/mla_attention_block_cached.h"
#include "models/spec/decoder_spec.h"

namespace mt {

struct DecodeCacheEntry {
  int64_t layer = 0;
  size_t sublayer = 0;  // position in spec.layers[layer].sublayers
  SublayerKind kind = SublayerKind::attention;
  AttentionCache attention;  // kind == attention, a GQA spec
  MlaCache mla;              // kind == attention, an MLA spec
  Mamba2Cache mamba2;        // kind == mamba2

  int64_t bytes() const { return attention.bytes() + mla.bytes() + mamba2.bytes(); }
};

struct DecodeCache {
  int64_t capacity = 0;  // positions it can hold
  int64_t length = 0;    // positions 0..length-1 are filled
  std::vector<DecodeCacheEntry> entries;  // in execution order

  // Zero-filled cache for `capacity` positions of a model with `spec`. mt::Error (one line) for capacity < 1.
  static DecodeCache create(const DecoderSpec& spec, int64_t capacity);
  // The entry of sublayer `sublayer` of `layer`, or nullptr when that sublayer keeps nothing.
  DecodeCacheEntry* find(int64_t layer, size_t sublayer);
  // Every entry's bytes: the attention entries' grow with the capacity, the Mamba2 entries' do not
  // (conv_dim × (conv_kernel − 1) + heads × head_dim × state fp32 values each).
  int64_t bytes() const;

 private:
  std::vector<std::vector<int>> entry_of_;  // [layer][sublayer] -> index into entries, or -1
};

}  // namespace mt
