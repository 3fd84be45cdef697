// Reading config.json fields for the family parsers: typed getters with ranges and defaults, where every
// error is one line naming the file and the field ("<file>: field 'x': <problem> (expected .., found ..)").
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace mt {

// Largest element count we accept for one parameter tensor (2^40, ~2 TB in bf16): bigger than any real
// checkpoint, small enough that shape products never overflow int64.
constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
// Any single size field above this is certainly hostile; keeps products of two sizes in range.
constexpr int64_t kMaxDim = int64_t{1} << 31;
constexpr int64_t kMaxLayers = 65536;
constexpr size_t kMaxConfigBytes = size_t{64} << 20;

// What a value is, for "found ..." in errors. Never dumps arrays/objects (could be huge or deep).
std::string json_found(const nlohmann::json& v);

// Reads the fields of one config object; every error names the file and the field.
struct FieldReader {
  const nlohmann::json& j;
  const std::string& file;

  [[noreturn]] void bad(const std::string& field, const std::string& problem, const std::string& expected,
                        const std::string& found) const;
  [[noreturn]] void missing(const std::string& field, const std::string& expected) const;

  const nlohmann::json* find(const std::string& field) const;
  bool present(const std::string& field) const { return find(field) != nullptr; }
  bool present_not_null(const std::string& field) const;

  int64_t as_int(const std::string& field, const nlohmann::json& v, int64_t min, int64_t max) const;
  int64_t get_int(const std::string& field, int64_t def, int64_t min = 1, int64_t max = kMaxDim) const;
  int64_t need_int(const std::string& field, int64_t min = 1, int64_t max = kMaxDim) const;
  double as_number(const std::string& field, const nlohmann::json& v, bool positive) const;
  double get_number(const std::string& field, double def, bool positive) const;
  bool get_bool(const std::string& field, bool def) const;
  std::string get_string(const std::string& field, const std::string& def) const;
};

// Product of sizes with an overflow-safe bound check: a * b * ... <= kMaxTensorElements.
void check_tensor_size(const FieldReader& r, const std::string& field, const std::string& tensor,
                       std::initializer_list<int64_t> dims);

// The storage dtype: v5 `dtype` or hub `torch_dtype` (a null means "not given"); F32 when neither.
DType read_dtype(const FieldReader& r);

// config.json `pad_token_id` as the padding_idx of Transformers' nn.Embedding(vocab_size, H, pad_token_id): absent
// or null is none; an integer in [-vocab_size, vocab_size) (a negative one wraps to vocab_size + id, as torch does;
// Transformers' config only warns about it); anything else is a one-line error naming the file and the field, as
// nn.Embedding refuses it.
std::optional<int64_t> read_padding_idx(const FieldReader& r, int64_t vocab_size);

struct CheckpointQuant;
// config.json `quantization_config`: absent or null is none; fine-grained FP8 ({"quant_method": "fp8", "fmt":
// "e4m3", "activation_scheme": "dynamic", "weight_block_size": [r, c]}) is dequantised on load; any other
// quant_method, or a malformed field, is a one-line error naming the file and the field.
CheckpointQuant read_checkpoint_quant(const FieldReader& r);

// The JSON of a config file (at most kMaxConfigBytes); one-line mt::Error naming `path` otherwise.
nlohmann::json read_config_file(const std::string& path);

}  // namespace mt
