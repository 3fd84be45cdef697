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

}  // namespace mt
