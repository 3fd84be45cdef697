// Keys and values of every decoder layer for the positions already run, so generation feeds each new
// token once instead of re-running the whole sequence. Stored after QK-norm and RoPE (what attention
// reads), in F32 (bf16-representable values for a BF16 model, so nothing is lost).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "models/spec/decoder_spec.h"

namespace mt {

struct KvCache {
  int64_t capacity = 0;  // positions it can hold
  int64_t length = 0;    // positions 0..length-1 are filled
  std::vector<Tensor> k;  // per layer F32 [capacity, kv_heads, head_dim]
  std::vector<Tensor> v;  // per layer F32 [capacity, kv_heads, head_dim]

  // Zero-filled cache for `capacity` positions of a model with `cfg` (capacity >= 1, else mt::Error).
  static KvCache create(const DecoderSpec& cfg, int64_t capacity);
  int64_t bytes() const;
};

}  // namespace mt
