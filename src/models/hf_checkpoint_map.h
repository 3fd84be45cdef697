// A spec's checkpoint converter: its family's rules (the registry row's hf_layout) over its parameter table, as
// the HfNameMap that loads the Hugging Face checkpoint into the table's tensors and saves them back.
#pragma once
#include "core/dtype.h"
#include "models/param_table.h"
#include "models/spec/decoder_spec.h"
#include "models/spec/hf_name_map.h"

namespace mt {

// One HfParam per table entry (buffers included), in the table's order; `dtype` is the model's parameter dtype
// (an entry of ParamDType::f32 stays F32).
std::vector<HfParam> hf_params_of(const ParamTable& table, DType dtype);

// The map for `spec` (its table must be param_table_of(spec)).
HfNameMap hf_name_map_of(const DecoderSpec& spec, const ParamTable& table, DType dtype);

}  // namespace mt
