#include "models/spec/config_writer.h"

#include <string>

#include "core/dtype.h"

namespace mt {

using nlohmann::json;

json config_json_common(const DecoderSpec& s, const AttentionSpec& a) {
  json j = s.raw.is_object() ? s.raw : json::object();
  if (!j.contains("architectures")) j["architectures"] = json::array({s.architecture});
  j["model_type"] = s.model_type;
  j["vocab_size"] = s.vocab_size;
  j["hidden_size"] = s.hidden_size;
  j["num_hidden_layers"] = s.num_layers();
  j["num_attention_heads"] = a.heads;
  j["num_key_value_heads"] = a.kv_heads;
  j["head_dim"] = a.head_dim;
  j["attention_bias"] = a.qkv_bias;
  j["tie_word_embeddings"] = s.tie_word_embeddings;
  j["rms_norm_eps"] = s.norm_eps;
  j["initializer_range"] = s.initializer_range;
  j["max_position_embeddings"] = s.max_position_embeddings;
  // pad_token_id stays as read (a negative id that wrapped stays negative): written only when the spec's padding
  // index is not the one it denotes (a spec edited in code). A family without padding_idx leaves it alone.
  if (s.padding_idx) {
    const auto it = j.find("pad_token_id");
    const bool same = it != j.end() && it->is_number_integer() &&
                      (it->get<int64_t>() == *s.padding_idx || it->get<int64_t>() + s.vocab_size == *s.padding_idx);
    if (!same) j["pad_token_id"] = *s.padding_idx;
  }
  return j;
}

json config_json_rope_base(const json& j, bool from_legacy) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!from_legacy && std::string(key) == "rope_scaling") break;
    if (j.contains(key) && j[key].is_object()) return j[key];
  }
  return json::object();
}

void config_json_finish(json& j, const DecoderSpec& s, json rope) {
  rope.erase("type");
  j["rope_parameters"] = std::move(rope);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["dtype"] = std::string(dtype_torch_name(s.dtype));
}

void config_json_set_layers(json& j, int64_t n) {
  j["num_hidden_layers"] = n;
  if (auto it = j.find("layer_types"); it != j.end() && it->is_array()) {
    if (static_cast<int64_t>(it->size()) < n) {
      j.erase(it);  // longer than listed: the family's default pattern
    } else {
      json cut = json::array();
      for (int64_t l = 0; l < n; ++l) cut.push_back((*it)[static_cast<size_t>(l)]);
      *it = cut;
    }
  }
  // Nemotron-H's layer list and pattern define the layer count: cut to n, or repeated cyclically up to n.
  if (auto it = j.find("layers_block_type"); it != j.end() && it->is_array() && !it->empty()) {
    json cut = json::array();
    for (int64_t l = 0; l < n; ++l) cut.push_back((*it)[static_cast<size_t>(l) % it->size()]);
    *it = cut;
  }
  if (auto it = j.find("hybrid_override_pattern"); it != j.end() && it->is_string() && !it->empty()) {
    const std::string p = it->get<std::string>();
    std::string cut;
    for (int64_t l = 0; l < n; ++l) cut += p[static_cast<size_t>(l) % p.size()];
    *it = cut;
  }
  if (auto it = j.find("mlp_only_layers"); it != j.end() && it->is_array()) {
    json kept = json::array();
    for (const json& v : *it)
      if (!v.is_number_integer() || v.get<int64_t>() < n) kept.push_back(v);
    *it = kept;
  }
}

}  // namespace mt
