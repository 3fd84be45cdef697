// Parameter-table entries the family files share: one entry placed at its layer and weight slot, and a GQA
// attention's projections in Transformers' order (q, k, v, o weights, each followed by its bias when the spec has
// one). What differs per family (sinks before them, QK-norms after them) stays in the family file.
#pragma once
#include <optional>
#include <string>

#include "models/param_table.h"
#include "models/spec/decoder_spec.h"

namespace mt {

void add_param(ParamTable& t, std::string name, Shape shape, ParamUse use, int64_t layer, int slot,
               ParamRole role = ParamRole::replicated, std::optional<ParamInit> init = std::nullopt);

// `prefix` + "q_proj.weight", "q_proj.bias", ..., "o_proj.bias" for attention `a` of layer `layer`.
void add_attention_projections(ParamTable& t, const std::string& prefix, const AttentionSpec& a, int64_t hidden,
                               int64_t layer);

}  // namespace mt
