// Specs whose layers hold other sublayer lists than Qwen's [attention, MLP | MoE], made by editing a parsed spec's
// layer list (no family reads such a config.json yet; the parameter table and both models read only the list).
// Shared by the CPU tests (tests/models) and the CUDA ones (tests/models/cuda).
//
// Two kinds of edit:
// - with_layout: any list of sublayer kinds per layer, each taking configuration 0 of its kind;
// - regrouped: the sublayers of a spec, kept in their execution order, cut into layers of other sizes. Every
//   sublayer then computes exactly what it computed before (the same norm weight, block and residual), so the
//   regrouped model's loss and gradients are bitwise the original's, its tensors renamed by regrouped_name.
#pragma once
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/model_weights.h"
#include "models/spec/decoder_spec.h"

namespace mt::test {

using SublayerLayout = std::vector<std::vector<SublayerKind>>;

// Every kind alone and both orders of attention with a feed-forward sublayer.
inline SublayerLayout mixed_layout() {
  using K = SublayerKind;
  return {{K::attention, K::moe}, {K::moe}, {K::attention}, {K::mlp, K::attention}, {K::attention, K::mlp}};
}

inline DecoderSpec with_layout(DecoderSpec s, const SublayerLayout& layout) {
  s.layers.clear();
  for (const std::vector<SublayerKind>& kinds : layout) {
    LayerSpec l;
    for (SublayerKind k : kinds) l.sublayers.push_back({k, 0});
    s.layers.push_back(l);
  }
  return s;
}

// The sublayers of s in execution order, cut into consecutive layers of `sizes` sublayers (sizes sum to their
// count).
inline DecoderSpec regrouped(const DecoderSpec& s, const std::vector<int>& sizes) {
  std::vector<Sublayer> flat;
  for (const LayerSpec& l : s.layers) flat.insert(flat.end(), l.sublayers.begin(), l.sublayers.end());
  DecoderSpec r = s;
  r.layers.clear();
  size_t next = 0;
  for (int n : sizes) {
    LayerSpec l;
    for (int i = 0; i < n; ++i) l.sublayers.push_back(flat.at(next++));
    r.layers.push_back(l);
  }
  MT_CHECK(next == flat.size(), "regrouped: sizes cover {} of {} sublayers", next, flat.size());
  return r;
}

// The name in regrouped(s, sizes) of the tensor `name` of s: a layer tensor moves with its sublayer (attention:
// self_attn.* and input_layernorm; MLP or MoE: mlp.* and post_attention_layernorm) to the layer now holding it.
inline std::string regrouped_name(const DecoderSpec& s, const std::vector<int>& sizes, const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return name;
  const size_t dot = name.find('.', prefix.size());
  const int64_t layer = std::stoll(name.substr(prefix.size(), dot - prefix.size()));
  const std::string rest = name.substr(dot + 1);
  const bool attention = rest.rfind("self_attn.", 0) == 0 || rest == "input_layernorm.weight";
  size_t flat = 0;  // the sublayer's position in execution order
  for (int64_t l = 0; l < layer; ++l) flat += s.layers[static_cast<size_t>(l)].sublayers.size();
  for (const Sublayer& sub : s.layers[static_cast<size_t>(layer)].sublayers) {
    if ((sub.kind == SublayerKind::attention) == attention) break;
    ++flat;
  }
  size_t first = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    if (flat < first + static_cast<size_t>(sizes[j])) return fmt::format("{}{}.{}", prefix, j, rest);
    first += static_cast<size_t>(sizes[j]);
  }
  fail("regrouped_name: {} is outside the regrouped layers", name);
}

// Host tensors of s (`w`: parameters or gradients) copied into a struct laid out for regrouped(s, sizes).
inline ModelWeights regrouped_weights(const DecoderSpec& s, const std::vector<int>& sizes, const ModelWeights& w) {
  const DecoderSpec r = regrouped(s, sizes);
  ModelWeights out = ModelWeights::zeros_like_config(r, w.embed.dtype());
  std::map<std::string, Tensor*> by_name;
  for (auto& [name, t] : out.named_parameters()) by_name[name] = t;
  for (const auto& [name, t] : w.named_parameters()) {
    Tensor* dst = by_name.at(regrouped_name(s, sizes, name));
    MT_CHECK(dst->shape() == t->shape() && dst->dtype() == t->dtype(), "regrouped_weights: {}", name);
    std::memcpy(dst->data(), t->data(), t->nbytes());
  }
  return out;
}

}  // namespace mt::test
