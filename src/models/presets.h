// Named model shapes for `mixtune init --preset` and `mixtune bench`: config.json contents of real
// checkpoints (with random weights) and small shapes for tests and the quickstart.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mt {

struct PresetInfo {
  std::string name;
  std::string description;
};

const std::vector<PresetInfo>& preset_list();
// The config.json of a preset; throws mt::Error listing the presets for an unknown name.
nlohmann::json preset_config_json(const std::string& name);

}  // namespace mt
