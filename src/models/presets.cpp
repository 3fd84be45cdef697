#include "models/presets.h"

#include "core/error.h"
#include "models/families/families.h"

namespace mt {

const std::vector<PresetInfo>& preset_list() {
  static const std::vector<PresetInfo> list = [] {
    std::vector<PresetInfo> r;
    for (auto* family : {&qwen3_presets, &gpt_oss_presets, &deepseek_v3_presets, &nemotron_h_presets}) {
      std::vector<PresetInfo> f = family();
      r.insert(r.end(), f.begin(), f.end());
    }
    return r;
  }();
  return list;
}

nlohmann::json preset_config_json(const std::string& name) {
  for (const PresetInfo& p : preset_list())
    if (p.name == name) return p.config();
  std::string names;
  for (const auto& p : preset_list()) names += (names.empty() ? "" : ", ") + p.name;
  fail("unknown preset '{}' (available: {})", name, names);
}

}  // namespace mt
