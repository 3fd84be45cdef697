#include "models/decode_cache.h"

#include <utility>

#include "core/error.h"

namespace mt {

DecodeCache DecodeCache::create(const DecoderSpec& spec, int64_t capacity) {
  if (capacity < 1) fail("decode cache: capacity must be >= 1 position, found {}", capacity);
  DecodeCache c;
  c.capacity = capacity;
  c.entry_of_.resize(spec.layers.size());
  for (int64_t l = 0; l < spec.num_layers(); ++l) {
    const std::vector<Sublayer>& subs = spec.layers[static_cast<size_t>(l)].sublayers;
    std::vector<int>& index = c.entry_of_[static_cast<size_t>(l)];
    index.assign(subs.size(), -1);
    for (size_t i = 0; i < subs.size(); ++i) {
      const Sublayer& sub = subs[i];
      DecodeCacheEntry e;
      e.layer = l;
      e.sublayer = i;
      e.kind = sub.kind;
      switch (sub.kind) {
        case SublayerKind::attention: {
          const AttentionSpec& a = spec.attention.at(static_cast<size_t>(sub.index));
          if (a.kind == AttentionKind::mla)
            e.mla = MlaCache::create(a, capacity);
          else
            e.attention = AttentionCache::create(a, capacity);
          index[i] = static_cast<int>(c.entries.size());
          c.entries.push_back(std::move(e));
          break;
        }
        case SublayerKind::mlp:
        case SublayerKind::moe: break;  // token by token: nothing to keep
        case SublayerKind::mamba2: {
          e.mamba2 = Mamba2Cache::create(spec.mamba2.at(static_cast<size_t>(sub.index)));
          index[i] = static_cast<int>(c.entries.size());
          c.entries.push_back(std::move(e));
          break;
        }
      }
    }
  }
  return c;
}

DecodeCacheEntry* DecodeCache::find(int64_t layer, size_t sublayer) {
  MT_CHECK(layer >= 0 && static_cast<size_t>(layer) < entry_of_.size() &&
               sublayer < entry_of_[static_cast<size_t>(layer)].size(),
           "decode cache: layer {} sublayer {} is not in the spec it was made for", layer, sublayer);
  const int e = entry_of_[static_cast<size_t>(layer)][sublayer];
  return e < 0 ? nullptr : &entries[static_cast<size_t>(e)];
}

int64_t DecodeCache::bytes() const {
  int64_t n = 0;
  for (const DecodeCacheEntry& e : entries) n += e.bytes();
  return n;
}

}  // namespace mt
