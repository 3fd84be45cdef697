// Named model shapes for `mixtune init --preset` and `mixtune bench`: config.json contents of real
// checkpoints (with random weights) and small shapes for tests and the quickstart. Each family file
// contributes its own (models/families/families.h).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mt {

struct PresetInfo {
  std::string name;
  std::string description;
  nlohmann::json (*config)() = nullptr;  // its config.json
};

const std::vector<PresetInfo>& preset_list();
// The config.json of a preset; throws mt::Error listing the presets for an unknown name.
nlohmann::json preset_config_json(const std::string& name);

}  // namespace mt
