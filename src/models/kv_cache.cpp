#include "models/kv_cache.h"

#include "core/error.h"

namespace mt {

KvCache KvCache::create(const DecoderSpec& cfg, int64_t capacity) {
  if (capacity < 1) fail("kv cache: capacity must be >= 1 position, found {}", capacity);
  KvCache c;
  c.capacity = capacity;
  for (int64_t l = 0; l < cfg.num_layers(); ++l) {
    const AttentionSpec* a = cfg.attention_of(l);
    MT_CHECK(a != nullptr, "kv cache: layer {} has no attention sublayer", l);
    c.k.push_back(Tensor::zeros({capacity, a->kv_heads, a->head_dim}, DType::F32));
    c.v.push_back(Tensor::zeros({capacity, a->kv_heads, a->value_dim()}, DType::F32));
  }
  return c;
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : k) n += static_cast<int64_t>(t.nbytes());
  for (const Tensor& t : v) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace mt
