#include "layers/costs/block_cost.h"

#include "core/error.h"
#include "layers/costs/attention_cost.h"
#include "layers/costs/mamba2_cost.h"
#include "layers/costs/mlp_cost.h"
#include "layers/costs/moe_cost.h"

namespace mt {

namespace {

// The attention spec of `s` (GQA or MLA: layers/costs/attention_cost.h).
const AttentionSpec& attention_with_kernels(const DecoderSpec& spec, int64_t /*layer*/, const Sublayer& s) {
  return spec.attention.at(static_cast<size_t>(s.index));
}

}  // namespace

BlockBytes sublayer_bytes(const DecoderSpec& spec, int64_t layer, const Sublayer& s, const BlockBatch& b) {
  const size_t i = static_cast<size_t>(s.index);
  switch (s.kind) {
    case SublayerKind::attention: return attention_bytes(attention_with_kernels(spec, layer, s), spec.hidden_size, b);
    case SublayerKind::mlp: return mlp_bytes(spec.mlp.at(i), spec.hidden_size, b);
    case SublayerKind::moe: return moe_bytes(spec.moe.at(i), spec.hidden_size, b);
    case SublayerKind::mamba2: return mamba2_bytes(spec.mamba2.at(i), spec.hidden_size, b);
  }
  fail("layer {}: unknown sublayer kind {}", layer, static_cast<int>(s.kind));
}

double sublayer_flops_per_token(const DecoderSpec& spec, int64_t layer, const Sublayer& s, int64_t seq) {
  const size_t i = static_cast<size_t>(s.index);
  switch (s.kind) {
    case SublayerKind::attention:
      return attention_flops_per_token(attention_with_kernels(spec, layer, s), spec.hidden_size, seq);
    case SublayerKind::mlp: return mlp_flops_per_token(spec.mlp.at(i), spec.hidden_size);
    case SublayerKind::moe: return moe_flops_per_token(spec.moe.at(i), spec.hidden_size);
    case SublayerKind::mamba2: return mamba2_flops_per_token(spec.mamba2.at(i), spec.hidden_size);
  }
  fail("layer {}: unknown sublayer kind {}", layer, static_cast<int>(s.kind));
}

}  // namespace mt
