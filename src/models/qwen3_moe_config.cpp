#include "models/qwen3_moe_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "models/registry.h"

namespace mt {

namespace {

using nlohmann::json;

// Largest element count we accept for one parameter tensor (2^40, ~2 TB in bf16): bigger than
// any real checkpoint, small enough that shape products never overflow int64.
constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
// Any single size field above this is certainly hostile; keeps products of two sizes in range.
constexpr int64_t kMaxDim = int64_t{1} << 31;
constexpr int64_t kMaxLayers = 65536;
constexpr size_t kMaxConfigBytes = size_t{64} << 20;

// What a value is, for "found ..." in errors. Never dumps arrays/objects (could be huge or deep).
std::string json_found(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return v.get<bool>() ? "true" : "false";
    case json::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case json::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case json::value_t::number_float: return fmt::format("{}", v.get<double>());
    case json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      std::string r = "string \"";
      for (size_t i = 0; i < s.size() && i < 60; ++i) r += (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
      return r + (s.size() > 60 ? "...\"" : "\"");
    }
    case json::value_t::array: return fmt::format("an array of {} elements", v.size());
    case json::value_t::object: return fmt::format("an object of {} keys", v.size());
    default: return "an unsupported JSON value";
  }
}

// Reads the fields of one config object; every error names the file and the field.
struct FieldReader {
  const json& j;
  const std::string& file;

  [[noreturn]] void bad(const std::string& field, const std::string& problem, const std::string& expected,
                        const std::string& found) const {
    fail("{}: field '{}': {} (expected {}, found {})", file, field, problem, expected, found);
  }
  [[noreturn]] void missing(const std::string& field, const std::string& expected) const {
    bad(field, "required field is missing", expected, "nothing");
  }

  const json* find(const std::string& field) const {
    auto it = j.find(field);
    return it == j.end() ? nullptr : &*it;
  }
  bool present(const std::string& field) const { return find(field) != nullptr; }
  bool present_not_null(const std::string& field) const {
    const json* v = find(field);
    return v && !v->is_null();
  }

  int64_t as_int(const std::string& field, const json& v, int64_t min, int64_t max) const {
    std::string expected = max >= kMaxDim ? fmt::format("an integer >= {}", min)
                                          : fmt::format("an integer in [{}, {}]", min, max);
    if (!v.is_number_integer()) bad(field, "wrong type", expected, json_found(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max))
      bad(field, "value out of range", expected, json_found(v));
    int64_t x = v.get<int64_t>();
    if (x < min || x > max) bad(field, "value out of range", expected, json_found(v));
    return x;
  }
  int64_t get_int(const std::string& field, int64_t def, int64_t min = 1, int64_t max = kMaxDim) const {
    const json* v = find(field);
    return v ? as_int(field, *v, min, max) : def;
  }
  int64_t need_int(const std::string& field, int64_t min = 1, int64_t max = kMaxDim) const {
    const json* v = find(field);
    if (!v) missing(field, fmt::format("an integer >= {}", min));
    return as_int(field, *v, min, max);
  }

  double as_number(const std::string& field, const json& v, bool positive) const {
    const char* expected = positive ? "a finite number > 0" : "a finite number >= 0";
    if (!v.is_number()) bad(field, "wrong type", expected, json_found(v));
    double x = v.get<double>();
    if (!std::isfinite(x) || x < 0 || (positive && x == 0)) bad(field, "value out of range", expected, json_found(v));
    return x;
  }
  double get_number(const std::string& field, double def, bool positive) const {
    const json* v = find(field);
    return v ? as_number(field, *v, positive) : def;
  }

  bool get_bool(const std::string& field, bool def) const {
    const json* v = find(field);
    if (!v) return def;
    if (!v->is_boolean()) bad(field, "wrong type", "true or false", json_found(*v));
    return v->get<bool>();
  }

  std::string get_string(const std::string& field, const std::string& def) const {
    const json* v = find(field);
    if (!v) return def;
    if (!v->is_string()) bad(field, "wrong type", "a string", json_found(*v));
    return v->get<std::string>();
  }
};

// Product of sizes with an overflow-safe bound check: a * b * ... <= kMaxTensorElements.
void check_tensor_size(const FieldReader& r, const std::string& field, const std::string& tensor,
                       std::initializer_list<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d != 0 && n > kMaxTensorElements / d)
      r.bad(field, fmt::format("tensor {} would be too large", tensor),
            fmt::format("at most {} elements", kMaxTensorElements), "more");
    n *= d;
  }
}

// rope: v5 `rope_parameters` {rope_type, rope_theta, ...} or legacy top-level `rope_theta`
// + `rope_scaling` {type|rope_type, ...}. Only the default (unscaled) RoPE is implemented.
double read_rope_theta(const FieldReader& r) {
  auto check_type = [&](const std::string& obj_field, const json& obj) {
    if (!obj.is_object()) r.bad(obj_field, "wrong type", "an object or null", json_found(obj));
    for (const char* key : {"rope_type", "type"}) {
      auto it = obj.find(key);
      if (it == obj.end()) continue;
      std::string name = obj_field + "." + key;
      if (!it->is_string()) r.bad(name, "wrong type", "a string", json_found(*it));
      if (*it != "default") r.bad(name, "unsupported RoPE type", "one of: default", json_found(*it));
    }
  };
  double theta = r.get_number("rope_theta", 10000.0, true);
  if (const json* sc = r.find("rope_scaling"); sc && !sc->is_null()) check_type("rope_scaling", *sc);
  if (const json* rp = r.find("rope_parameters"); rp && !rp->is_null()) {
    check_type("rope_parameters", *rp);
    if (auto it = rp->find("rope_theta"); it != rp->end()) theta = r.as_number("rope_parameters.rope_theta", *it, true);
  }
  return theta;
}

DType read_dtype(const FieldReader& r) {
  // v5 writes "dtype"; hub files have "torch_dtype". A null means "not given".
  for (const char* field : {"dtype", "torch_dtype"}) {
    const json* v = r.find(field);
    if (!v || v->is_null()) continue;
    const char* expected = "a float dtype name such as \"bfloat16\" or \"float32\"";
    if (!v->is_string()) r.bad(field, "wrong type", expected, json_found(*v));
    std::optional<DType> d = dtype_from_torch_name(v->get_ref<const std::string&>());
    if (!d || !(*d == DType::F32 || *d == DType::BF16 || *d == DType::F16))
      r.bad(field, "unsupported dtype", "\"float32\", \"bfloat16\" or \"float16\"", json_found(*v));
    return *d;
  }
  return DType::F32;
}

}  // namespace

bool Qwen3MoeConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

Qwen3MoeConfig Qwen3MoeConfig::from_json(const json& j, const std::string& file) {
  if (!j.is_object()) fail("{}: field '(root)': wrong type (expected a JSON object, found {})", file, json_found(j));
  FieldReader r{j, file};
  Qwen3MoeConfig c;
  c.raw = j;

  // architectures[0] picks the model class, as AutoModelForCausalLM does.
  const json* archs = r.find("architectures");
  if (!archs) r.missing("architectures", "a non-empty list of strings");
  if (!archs->is_array() || archs->empty())
    r.bad("architectures", "wrong type", "a non-empty list of strings", json_found(*archs));
  if (!(*archs)[0].is_string()) r.bad("architectures[0]", "wrong type", "a string", json_found((*archs)[0]));
  const ArchitectureInfo& arch = architecture_lookup((*archs)[0].get<std::string>(), file);
  if (arch.name != "Qwen3MoeForCausalLM" && arch.name != "Qwen3ForCausalLM")
    r.bad("architectures[0]", "not a Qwen3 architecture", "Qwen3MoeForCausalLM or Qwen3ForCausalLM", arch.name);
  c.architecture = arch.name;
  c.model_type = arch.model_type;
  const bool moe = arch.name == "Qwen3MoeForCausalLM";
  if (r.present("model_type")) {
    std::string mt = r.get_string("model_type", "");
    if (mt != arch.model_type)
      r.bad("model_type", fmt::format("does not match architecture {}", arch.name),
            fmt::format("\"{}\"", arch.model_type), json_found(*r.find("model_type")));
  }

  c.vocab_size = r.need_int("vocab_size");
  c.hidden_size = r.need_int("hidden_size");
  c.num_hidden_layers = r.need_int("num_hidden_layers", 1, kMaxLayers);
  c.num_attention_heads = r.need_int("num_attention_heads");
  // HF: null means "as many as the query heads"; missing takes the class default (Qwen3-MoE 4, Qwen3 32).
  if (r.present_not_null("num_key_value_heads"))
    c.num_key_value_heads = r.need_int("num_key_value_heads");
  else
    c.num_key_value_heads = r.present("num_key_value_heads") ? c.num_attention_heads : (moe ? 4 : 32);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.bad("num_key_value_heads", "num_attention_heads must be a multiple of it",
          fmt::format("a divisor of num_attention_heads = {}", c.num_attention_heads),
          std::to_string(c.num_key_value_heads));
  // head_dim: Qwen3Config declares it (default 128); Qwen3MoeConfig does not, so the modelling
  // code falls back to hidden_size / heads. null means "not given" in both.
  if (r.present_not_null("head_dim"))
    c.head_dim = r.need_int("head_dim");
  else if (!moe && !r.present("head_dim"))
    c.head_dim = 128;
  else
    c.head_dim = c.hidden_size / c.num_attention_heads;
  if (c.head_dim <= 0)
    r.bad("head_dim", "hidden_size / num_attention_heads is zero", "a positive head_dim", "0");
  if (c.head_dim % 2 != 0)
    r.bad("head_dim", "RoPE rotates the two halves of a head", "an even number", std::to_string(c.head_dim));

  if (moe) {
    bool has_ne = r.present("num_experts"), has_nle = r.present("num_local_experts");
    if (!has_ne && !has_nle) r.missing("num_experts", "an integer >= 1 (spelled num_experts or num_local_experts)");
    if (has_ne) c.num_experts = r.need_int("num_experts");
    if (has_nle) {
      int64_t n = r.need_int("num_local_experts");
      if (has_ne && n != c.num_experts)
        r.bad("num_local_experts", "disagrees with num_experts", std::to_string(c.num_experts), std::to_string(n));
      c.num_experts = n;
    }
    c.num_experts_per_tok = r.need_int("num_experts_per_tok", 1, c.num_experts);
    c.moe_intermediate_size = r.need_int("moe_intermediate_size");
    c.decoder_sparse_step = r.get_int("decoder_sparse_step", 1);
    if (const json* v = r.find("mlp_only_layers")) {
      if (!v->is_array()) r.bad("mlp_only_layers", "wrong type", "a list of layer indices", json_found(*v));
      for (size_t i = 0; i < v->size(); ++i)
        c.mlp_only_layers.push_back(
            r.as_int(fmt::format("mlp_only_layers[{}]", i), (*v)[i], 0, c.num_hidden_layers - 1));
    }
    c.norm_topk_prob = r.get_bool("norm_topk_prob", false);
    c.output_router_logits = r.get_bool("output_router_logits", false);
    c.router_aux_loss_coef = r.get_number("router_aux_loss_coef", 0.001, false);
  } else {
    c.num_experts = 0;
    c.num_experts_per_tok = 0;
  }

  // Layer 0 is dense whenever decoder_sparse_step > 1; mlp_only_layers entries are valid indices.
  const bool any_dense = !moe || c.decoder_sparse_step > 1 || !c.mlp_only_layers.empty();
  if (any_dense)
    c.intermediate_size = r.need_int("intermediate_size");
  else
    c.intermediate_size = r.get_int("intermediate_size", 6144);

  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.rms_norm_eps = r.get_number("rms_norm_eps", 1e-6, true);
  c.initializer_range = r.get_number("initializer_range", 0.02, false);
  c.max_position_embeddings = r.get_int("max_position_embeddings", 32768);
  c.rope_theta = read_rope_theta(r);
  c.dtype = read_dtype(r);

  if (std::string act = r.get_string("hidden_act", "silu"); act != "silu")
    r.bad("hidden_act", "unsupported activation", "\"silu\"", json_found(*r.find("hidden_act")));
  if (r.get_bool("use_sliding_window", false))
    r.bad("use_sliding_window", "sliding-window attention is not supported", "false", "true");
  c.attention_bias = r.get_bool("attention_bias", false);
  if (c.attention_bias) r.bad("attention_bias", "attention biases are not supported yet", "false", "true");

  // Tensor sizes must stay far from int64 overflow whatever the fields say.
  check_tensor_size(r, "vocab_size", "embed_tokens", {c.vocab_size, c.hidden_size});
  check_tensor_size(r, "num_attention_heads", "q_proj", {c.num_attention_heads, c.head_dim, c.hidden_size});
  check_tensor_size(r, "intermediate_size", "mlp.gate_proj", {c.intermediate_size, c.hidden_size});
  if (moe) {
    check_tensor_size(r, "num_experts", "mlp.experts.gate_up_proj",
                      {c.num_experts, 2, c.moe_intermediate_size, c.hidden_size});
    check_tensor_size(r, "num_experts", "mlp.gate", {c.num_experts, c.hidden_size});
  }
  return c;
}

Qwen3MoeConfig Qwen3MoeConfig::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open config file", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() > kMaxConfigBytes)
    fail("{}: config file is too large (expected at most {} bytes, found {})", path, kMaxConfigBytes, text.size());
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());  // nlohmann's message is one line with the byte position
  }
  return from_json(j, path);
}

json Qwen3MoeConfig::to_json() const {
  json j = raw.is_object() ? raw : json::object();
  if (!j.contains("architectures")) j["architectures"] = json::array({architecture});
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["rms_norm_eps"] = rms_norm_eps;
  j["initializer_range"] = initializer_range;
  j["max_position_embeddings"] = max_position_embeddings;
  if (is_moe()) {
    // v5 canonical spelling of the expert count.
    j.erase("num_experts");
    j["num_local_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
    j["norm_topk_prob"] = norm_topk_prob;
    j["output_router_logits"] = output_router_logits;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
  }
  // v5 folds rope_theta / rope_scaling into rope_parameters; keep any extra keys it had.
  json rope = (j.contains("rope_parameters") && j["rope_parameters"].is_object()) ? j["rope_parameters"]
                                                                                  : json::object();
  rope.erase("type");
  rope["rope_type"] = "default";
  rope["rope_theta"] = rope_theta;
  j["rope_parameters"] = rope;
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["dtype"] = std::string(dtype_torch_name(dtype));
  return j;
}

}  // namespace mt
