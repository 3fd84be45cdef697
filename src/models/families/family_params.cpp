#include "models/families/family_params.h"

#include <utility>

#include "models/model_weights.h"

namespace mt {

void add_param(ParamTable& t, std::string name, Shape shape, ParamUse use, int64_t layer, int slot, ParamRole role,
               std::optional<ParamInit> init) {
  ParamEntry e = param_entry(std::move(name), std::move(shape), use, role);
  e.layer = layer;
  e.slot = slot;
  if (init) e.init = *init;
  t.add(std::move(e));
}

void add_attention_projections(ParamTable& t, const std::string& prefix, const AttentionSpec& a, int64_t hidden,
                               int64_t layer) {
  using U = ParamUse;
  using W = WeightSlot;
  const int64_t nq = a.heads * a.head_dim, nkv = a.kv_heads * a.head_dim;
  add_param(t, prefix + "q_proj.weight", {nq, hidden}, U::linear, layer, W::q_proj);
  if (a.qkv_bias) add_param(t, prefix + "q_proj.bias", {nq}, U::bias, layer, W::q_bias);
  add_param(t, prefix + "k_proj.weight", {nkv, hidden}, U::linear, layer, W::k_proj);
  if (a.qkv_bias) add_param(t, prefix + "k_proj.bias", {nkv}, U::bias, layer, W::k_bias);
  add_param(t, prefix + "v_proj.weight", {nkv, hidden}, U::linear, layer, W::v_proj);
  if (a.qkv_bias) add_param(t, prefix + "v_proj.bias", {nkv}, U::bias, layer, W::v_bias);
  add_param(t, prefix + "o_proj.weight", {hidden, nq}, U::linear, layer, W::o_proj);
  if (a.o_bias) add_param(t, prefix + "o_proj.bias", {hidden}, U::bias, layer, W::o_bias);
}

}  // namespace mt
