// The RoPE tables of one batch's positions for every attention sublayer of a spec: one table per distinct
// (RopeSpec, head_dim) among the sublayers the layers run, so attention configurations that rotate alike share
// one (a Qwen3 model builds exactly one). Each attention block takes the table of its own spec.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/rope.h"
#include "models/spec/decoder_spec.h"

namespace mt {

struct RopeTableSet {
  struct Entry {
    RopeSpec rope;
    int64_t head_dim = 0;
    cpu::RopeTables tables;  // [T, rotated dims]
  };
  std::vector<Entry> entries;  // in the order the layers first use them

  // positions I64 (any shape, T values). Default or YaRN frequencies over the rotated dims (rope.rotary_dim, or
  // the whole head); the table is [T, rotated dims] for either layout (half split or interleaved). Attention
  // without RoPE (RopeKind::none) gets no table.
  static RopeTableSet build(const DecoderSpec& spec, const Tensor& positions, bool bf16);
  // The tables for attention `a` of the spec the set was built from.
  const cpu::RopeTables& of(const AttentionSpec& a) const;
};

}  // namespace mt
