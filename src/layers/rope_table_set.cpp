#include "layers/rope_table_set.h"

#include "core/error.h"

namespace mt {

namespace {
const RopeTableSet::Entry* find_entry(const std::vector<RopeTableSet::Entry>& entries, const AttentionSpec& a) {
  for (const RopeTableSet::Entry& e : entries)
    if (e.rope == a.rope && e.head_dim == a.head_dim) return &e;
  return nullptr;
}
}  // namespace

RopeTableSet RopeTableSet::build(const DecoderSpec& spec, const Tensor& positions, bool bf16) {
  RopeTableSet set;
  for (const LayerSpec& layer : spec.layers)
    for (const Sublayer& sub : layer.sublayers) {
      if (sub.kind != SublayerKind::attention) continue;
      const AttentionSpec& a = spec.attention.at(static_cast<size_t>(sub.index));
      if (a.rope.kind == RopeKind::none || find_entry(set.entries, a)) continue;  // NoPE needs no table
      const RopeSpec& r = a.rope;
      // The rotated dims: the whole head, or (MLA) rotary_dim of them, whose frequencies span rotary_dim alone.
      const int64_t D = r.rotary_dim > 0 ? r.rotary_dim : a.head_dim;
      const std::vector<float> inv_freq =
          r.kind == RopeKind::yarn ? cpu::rope_yarn_inv_freq(D, r.theta, r.factor, r.beta_fast, r.beta_slow,
                                                             r.original_max_position, r.truncate)
                                   : cpu::rope_default_inv_freq(D, r.theta);
      const float factor = r.kind == RopeKind::yarn ? static_cast<float>(r.attention_factor) : 1.0f;
      set.entries.push_back({a.rope, a.head_dim, cpu::rope_tables(positions, inv_freq, factor, bf16)});
    }
  return set;
}

const cpu::RopeTables& RopeTableSet::of(const AttentionSpec& a) const {
  const Entry* e = find_entry(entries, a);
  MT_CHECK(e != nullptr, "no RoPE table for head_dim {} theta {} (built from another spec?)", a.head_dim,
           a.rope.theta);
  return e->tables;
}

}  // namespace mt
