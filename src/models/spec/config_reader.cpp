#include "models/spec/config_reader.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "models/spec/decoder_spec.h"

namespace mt {

using nlohmann::json;

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

void FieldReader::bad(const std::string& field, const std::string& problem, const std::string& expected,
                      const std::string& found) const {
  fail("{}: field '{}': {} (expected {}, found {})", file, field, problem, expected, found);
}

void FieldReader::missing(const std::string& field, const std::string& expected) const {
  bad(field, "required field is missing", expected, "nothing");
}

const json* FieldReader::find(const std::string& field) const {
  auto it = j.find(field);
  return it == j.end() ? nullptr : &*it;
}

bool FieldReader::present_not_null(const std::string& field) const {
  const json* v = find(field);
  return v && !v->is_null();
}

int64_t FieldReader::as_int(const std::string& field, const json& v, int64_t min, int64_t max) const {
  std::string expected = max >= kMaxDim ? fmt::format("an integer >= {}", min)
                                        : fmt::format("an integer in [{}, {}]", min, max);
  if (!v.is_number_integer()) bad(field, "wrong type", expected, json_found(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max))
    bad(field, "value out of range", expected, json_found(v));
  int64_t x = v.get<int64_t>();
  if (x < min || x > max) bad(field, "value out of range", expected, json_found(v));
  return x;
}

int64_t FieldReader::get_int(const std::string& field, int64_t def, int64_t min, int64_t max) const {
  const json* v = find(field);
  return v ? as_int(field, *v, min, max) : def;
}

int64_t FieldReader::need_int(const std::string& field, int64_t min, int64_t max) const {
  const json* v = find(field);
  if (!v) missing(field, fmt::format("an integer >= {}", min));
  return as_int(field, *v, min, max);
}

double FieldReader::as_number(const std::string& field, const json& v, bool positive) const {
  const char* expected = positive ? "a finite number > 0" : "a finite number >= 0";
  if (!v.is_number()) bad(field, "wrong type", expected, json_found(v));
  double x = v.get<double>();
  if (!std::isfinite(x) || x < 0 || (positive && x == 0)) bad(field, "value out of range", expected, json_found(v));
  return x;
}

double FieldReader::get_number(const std::string& field, double def, bool positive) const {
  const json* v = find(field);
  return v ? as_number(field, *v, positive) : def;
}

bool FieldReader::get_bool(const std::string& field, bool def) const {
  const json* v = find(field);
  if (!v) return def;
  if (!v->is_boolean()) bad(field, "wrong type", "true or false", json_found(*v));
  return v->get<bool>();
}

std::string FieldReader::get_string(const std::string& field, const std::string& def) const {
  const json* v = find(field);
  if (!v) return def;
  if (!v->is_string()) bad(field, "wrong type", "a string", json_found(*v));
  return v->get<std::string>();
}

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

DType read_dtype(const FieldReader& r) {
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

std::optional<int64_t> read_padding_idx(const FieldReader& r, int64_t vocab_size) {
  const json* v = r.find("pad_token_id");
  if (!v || v->is_null()) return std::nullopt;
  const std::string expected = fmt::format("null or an integer in [{}, {})", -vocab_size, vocab_size);
  if (!v->is_number_integer()) r.bad("pad_token_id", "wrong type", expected, json_found(*v));
  const bool in_range = v->is_number_unsigned()
                            ? v->get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                            : v->get<int64_t>() >= -vocab_size && v->get<int64_t>() < vocab_size;
  if (!in_range)
    r.bad("pad_token_id", "outside the vocabulary (Transformers' nn.Embedding refuses it as padding_idx)", expected,
          json_found(*v));
  const int64_t id = v->get<int64_t>();
  return id < 0 ? vocab_size + id : id;
}

CheckpointQuant read_checkpoint_quant(const FieldReader& r) {
  CheckpointQuant q;
  const json* qc = r.find("quantization_config");
  if (!qc || qc->is_null()) return q;
  const std::string f = "quantization_config";
  if (!qc->is_object()) r.bad(f, "wrong type", "an object or null", json_found(*qc));
  auto field = [&](const char* key) -> const json* {
    auto it = qc->find(key);
    return it == qc->end() ? nullptr : &*it;
  };
  const json* method = field("quant_method");
  if (!method) r.missing(f + ".quant_method", "\"fp8\" or \"mxfp4\"");
  if (method->is_string() && *method == "mxfp4") {
    // GPT-OSS (§8.5): the experts are stored as `_blocks` + `_scales`, the modules listed here in bf16. Which
    // tensors may be MXFP4 is the family's layout's to say; the list only has to be well-formed.
    if (const json* keep = field("modules_to_not_convert"); keep && !keep->is_null()) {
      if (!keep->is_array()) r.bad(f + ".modules_to_not_convert", "wrong type", "a list of strings", json_found(*keep));
      for (size_t i = 0; i < keep->size(); ++i)
        if (!(*keep)[i].is_string())
          r.bad(fmt::format("{}.modules_to_not_convert[{}]", f, i), "wrong type", "a string", json_found((*keep)[i]));
    }
    q.method = CheckpointQuant::Method::mxfp4;
    return q;
  }
  if (!method->is_string() || *method != "fp8")
    r.bad(f + ".quant_method",
          "unsupported quantisation (fine-grained FP8 and MXFP4 checkpoints are dequantised on load)",
          "\"fp8\" or \"mxfp4\"", json_found(*method));
  q.method = CheckpointQuant::Method::fp8_block;
  // Qwen's FP8 configs add "fmt"; HF's FineGrainedFP8Config stores e4m3 weights only.
  if (const json* form = field("fmt"); form && !form->is_null() && *form != "e4m3")
    r.bad(f + ".fmt", "unsupported FP8 format", "\"e4m3\"", json_found(*form));
  // Static activation scales come as extra tensors the engine has no use for; dynamic is what HF and Qwen use.
  if (const json* act = field("activation_scheme"); act && !act->is_null() && *act != "dynamic")
    r.bad(f + ".activation_scheme", "unsupported activation scheme", "\"dynamic\"", json_found(*act));
  if (const json* bs = field("weight_block_size")) {
    const std::string name = f + ".weight_block_size";
    if (!bs->is_array() || bs->size() != 2)
      r.bad(name, "wrong type", "a list of two positive integers", json_found(*bs));
    q.block_rows = r.as_int(name + "[0]", (*bs)[0], 1, kMaxDim);
    q.block_cols = r.as_int(name + "[1]", (*bs)[1], 1, kMaxDim);
  }
  return q;
}

json read_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open config file", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() > kMaxConfigBytes)
    fail("{}: config file is too large (expected at most {} bytes, found {})", path, kMaxConfigBytes, text.size());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());  // nlohmann's message is one line with the byte position
  }
}

}  // namespace mt
