#include "models/hf_checkpoint_map.h"

#include "models/registry.h"

namespace mt {

std::vector<HfParam> hf_params_of(const ParamTable& table, DType dtype) {
  std::vector<HfParam> r;
  r.reserve(table.entries().size());
  for (const ParamEntry& e : table.entries())
    r.push_back({e.name, e.shape, param_dtype(e, dtype), e.role == ParamRole::expert_stack});
  return r;
}

HfNameMap hf_name_map_of(const DecoderSpec& spec, const ParamTable& table, DType dtype) {
  return HfNameMap(hf_layout_of(spec), hf_params_of(table, dtype));
}

}  // namespace mt
