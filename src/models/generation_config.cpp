#include "models/generation_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace mt {

namespace {

constexpr size_t kMaxFileBytes = 1 << 20;

const nlohmann::json* field(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// eos_token_id: an int or a list of ints; absent/null gives an empty list.
std::vector<int64_t> read_eos(const nlohmann::json& j, const std::string& file) {
  std::vector<int64_t> ids;
  const nlohmann::json* e = field(j, "eos_token_id");
  if (!e) return ids;
  auto one = [&](const nlohmann::json& v, const std::string& where) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      fail("{}: {}: expected a token id (integer >= 0), found {}", file, where, v.dump());
    ids.push_back(v.get<int64_t>());
  };
  if (e->is_array()) {
    for (size_t i = 0; i < e->size(); ++i) one((*e)[i], "eos_token_id[" + std::to_string(i) + "]");
  } else {
    one(*e, "eos_token_id");
  }
  return ids;
}

}  // namespace

GenerationConfig generation_config_from_json(const nlohmann::json& j, const std::string& file) {
  if (!j.is_object()) fail("{}: expected a JSON object, found {}", file, j.type_name());
  GenerationConfig g;
  if (const auto* v = field(j, "do_sample")) {
    if (!v->is_boolean()) fail("{}: do_sample: expected true or false, found {}", file, v->dump());
    g.do_sample = v->get<bool>();
  }
  if (const auto* v = field(j, "temperature")) {
    if (!v->is_number() || !(v->get<double>() >= 0))
      fail("{}: temperature: expected a number >= 0, found {}", file, v->dump());
    g.temperature = v->get<double>();
  }
  if (const auto* v = field(j, "top_p")) {
    if (!v->is_number() || !(v->get<double>() > 0 && v->get<double>() <= 1))
      fail("{}: top_p: expected a number in (0, 1], found {}", file, v->dump());
    g.top_p = v->get<double>();
  }
  if (const auto* v = field(j, "top_k")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      fail("{}: top_k: expected an integer >= 0, found {}", file, v->dump());
    g.top_k = v->get<int64_t>();
  }
  g.eos_token_ids = read_eos(j, file);
  return g;
}

GenerationConfig generation_config_read(const std::string& model_dir, const nlohmann::json& config_json) {
  const std::filesystem::path p = std::filesystem::path(model_dir) / "generation_config.json";
  GenerationConfig g;
  if (std::filesystem::exists(p)) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail("{}: cannot open", p.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    if (text.size() > kMaxFileBytes)
      fail("{}: file is too large (expected at most {} bytes, found {})", p.string(), kMaxFileBytes, text.size());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", p.string(), e.what());
    }
    g = generation_config_from_json(j, p.string());
    if (field(j, "eos_token_id")) return g;
  }
  if (config_json.is_object())
    g.eos_token_ids = read_eos(config_json, (std::filesystem::path(model_dir) / "config.json").string());
  return g;
}

}  // namespace mt
