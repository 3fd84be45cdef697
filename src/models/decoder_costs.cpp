#include "models/decoder_costs.h"

#include <algorithm>
#include <vector>

#include "layers/costs/attention_cost.h"

namespace mt {

LayerBytes decoder_layer_bytes(const DecoderSpec& spec, int64_t layer, const BlockBatch& b) {
  const auto& subs = spec.layers.at(static_cast<size_t>(layer)).sublayers;
  const CostBytes stream = CostBytes{b.tokens} * spec.hidden_size * kCostBf16;  // one [T, H] bf16 residual stream
  const CostBytes between = std::max<CostBytes>(static_cast<CostBytes>(subs.size()) - 1, 0) * stream;
  const bool full = b.recompute == Recompute::full;
  LayerBytes r;
  r.saved = stream /*x_in*/ + (full ? 0 : between);
  r.backward_peak = (full ? between : 0) + 2 * stream /*dx, dx_mid*/;
  for (const Sublayer& s : subs) {
    const BlockBytes c = sublayer_bytes(spec, layer, s, b);
    r.saved += c.saved;
    r.backward_peak += c.recomputed + c.backward;
  }
  return r;
}

CostBytes decoder_rope_table_bytes(const DecoderSpec& spec, int64_t tokens) {
  std::vector<bool> used(spec.attention.size(), false);
  for (const LayerSpec& l : spec.layers)
    for (const Sublayer& s : l.sublayers)
      if (s.kind == SublayerKind::attention) used.at(static_cast<size_t>(s.index)) = true;
  CostBytes r = 0;
  for (size_t i = 0; i < used.size(); ++i)
    if (used[i]) r += attention_rope_table_bytes(spec.attention[i], tokens);
  return r;
}

double decoder_flops_per_token(const DecoderSpec& spec, int64_t seq) {
  double f = 2.0 * static_cast<double>(spec.vocab_size) * static_cast<double>(spec.hidden_size);  // LM head
  for (int64_t l = 0; l < spec.num_layers(); ++l)
    for (const Sublayer& s : spec.layers[static_cast<size_t>(l)].sublayers)
      f += sublayer_flops_per_token(spec, l, s, seq);
  return f;
}

double decoder_train_flops_per_token(const DecoderSpec& spec, int64_t seq) {
  return 3.0 * decoder_flops_per_token(spec, seq);
}

}  // namespace mt
