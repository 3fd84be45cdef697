// generation_config.json: the sampling defaults and stop tokens a checkpoint ships for generate().
// Only the fields mixtune uses are read; null means absent, as in Transformers' GenerationConfig.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mt {

struct GenerationConfig {
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::vector<int64_t> eos_token_ids;  // generation_config's eos_token_id (int or list), else config.json's
};

// Reads `model_dir`/generation_config.json when it exists; `config_json` is config.json as read (its
// eos_token_id is the fallback). Wrong types or values are an mt::Error naming the file and the field.
GenerationConfig generation_config_read(const std::string& model_dir, const nlohmann::json& config_json);

// The same from JSON already read; `file` names it in errors.
GenerationConfig generation_config_from_json(const nlohmann::json& j, const std::string& file);

}  // namespace mt
