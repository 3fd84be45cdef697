#include "data/token_jsonl.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "core/error.h"

namespace mt {

namespace {
using json = nlohmann::json;

std::vector<int64_t> read_int_list(const json& obj, const char* field, const std::string& where, bool required) {
  std::vector<int64_t> out;
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) {
    if (required) fail("{}: field '{}' is missing", where, field);
    return out;
  }
  if (!it->is_array()) fail("{}: field '{}' must be a list of integers", where, field);
  out.reserve(it->size());
  for (const auto& v : *it) {
    if (!v.is_number_integer()) fail("{}: field '{}' must be a list of integers (found {})", where, field, v.dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}
}  // namespace

std::vector<TokenRecord> token_jsonl_read(const std::string& path, int64_t vocab_size) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open", path);
  std::vector<TokenRecord> out;
  std::string text;
  int64_t line_no = 0;
  while (std::getline(f, text)) {
    ++line_no;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    json obj = json::parse(text, nullptr, false);
    if (obj.is_discarded()) fail("{}: not valid JSON", where);
    if (!obj.is_object()) fail("{}: each line must be a JSON object", where);
    TokenRecord r;
    r.line = line_no;
    r.input_ids = read_int_list(obj, "input_ids", where, true);
    r.labels = read_int_list(obj, "labels", where, false);
    r.position_ids = read_int_list(obj, "position_ids", where, false);
    if (r.input_ids.empty()) fail("{}: field 'input_ids' is empty", where);
    if (r.labels.empty()) r.labels = r.input_ids;
    if (r.labels.size() != r.input_ids.size())
      fail("{}: field 'labels' has {} values but 'input_ids' has {}", where, r.labels.size(), r.input_ids.size());
    if (!r.position_ids.empty() && r.position_ids.size() != r.input_ids.size())
      fail("{}: field 'position_ids' has {} values but 'input_ids' has {}", where, r.position_ids.size(),
           r.input_ids.size());
    for (int64_t id : r.input_ids)
      if (id < 0 || id >= vocab_size)
        fail("{}: field 'input_ids': token id {} is outside the vocabulary [0, {})", where, id, vocab_size);
    for (int64_t id : r.labels)
      if (id != -100 && (id < 0 || id >= vocab_size))
        fail("{}: field 'labels': value {} is neither -100 nor in [0, {})", where, id, vocab_size);
    for (int64_t p : r.position_ids)
      if (p < 0) fail("{}: field 'position_ids': negative position {}", where, p);
    out.push_back(std::move(r));
  }
  if (out.empty()) fail("{}: no records", path);
  return out;
}

}  // namespace mt
