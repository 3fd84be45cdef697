#include "io/checkpoint_files.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_text.h"

namespace fs = std::filesystem;

namespace mt {

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr uint64_t kMaxIndexBytes = 100'000'000;

// A shard name must stay inside the checkpoint directory.
bool is_plain_filename(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_small_file(const std::string& path) {
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  if (ec) fail("cannot read {}: {}", path, ec.message());
  if (size > kMaxIndexBytes) fail("{}: {} bytes, larger than the {}-byte limit for an index", path, size, kMaxIndexBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

CheckpointFiles CheckpointFiles::open(const std::string& dir) {
  CheckpointFiles c;
  c.dir_ = dir;
  const std::string index_path = dir + "/" + kIndexFile;
  const std::string single_path = dir + "/" + kSingleFile;
  std::error_code ec;

  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec)) fail("no {} or {} in {}", kSingleFile, kIndexFile, dir);
    c.shard_files_ = {kSingleFile};
    c.shards_.push_back(SafetensorsFile::open(single_path));
    c.names_ = c.shards_[0].names();
    for (const auto& n : c.names_) c.shard_index_[n] = 0;
    return c;
  }

  auto index = json_parse_strict(read_small_file(index_path), index_path, 8);
  if (!index.is_object()) fail("{}: must be a JSON object, found {}", index_path, index.type_name());
  if (index.contains("metadata")) {
    const auto& m = index.at("metadata");
    if (!m.is_object()) fail("{}: \"metadata\" must be an object, found {}", index_path, m.type_name());
    c.index_metadata_ = nlohmann::json::parse(m.dump());
  }
  if (!index.contains("weight_map")) fail("{}: missing \"weight_map\"", index_path);
  const auto& wm = index.at("weight_map");
  if (!wm.is_object()) fail("{}: \"weight_map\" must be an object, found {}", index_path, wm.type_name());

  std::vector<std::pair<std::string, std::string>> entries;  // tensor -> shard, file order
  std::set<std::string> shard_set;
  for (const auto& [name, shard] : wm.items()) {
    if (!shard.is_string())
      fail("{}: weight_map {} must map to a file name, found {}", index_path, json_quote_short(name),
           shard.type_name());
    const auto& file = shard.get_ref<const std::string&>();
    if (!is_plain_filename(file))
      fail("{}: weight_map {} names shard {}, expected a plain file name in the same directory", index_path,
           json_quote_short(name), json_quote_short(file));
    entries.emplace_back(name, file);
    shard_set.insert(file);
  }
  c.shard_files_.assign(shard_set.begin(), shard_set.end());
  std::map<std::string, size_t> shard_pos;
  for (const auto& file : c.shard_files_) {
    const std::string path = dir + "/" + file;
    if (!fs::is_regular_file(path, ec))
      fail("{}: shard {} is missing ({} is not a file)", index_path, json_quote_short(file), path);
    shard_pos[file] = c.shards_.size();
    c.shards_.push_back(SafetensorsFile::open(path));
  }
  for (const auto& [name, file] : entries) {
    const size_t pos = shard_pos.at(file);
    if (!c.shards_[pos].has(name))
      fail("{}: tensor {} is mapped to shard {}, which has no such tensor", index_path, json_quote_short(name),
           file);
    c.names_.push_back(name);
    c.shard_index_[name] = pos;
  }
  for (size_t pos = 0; pos < c.shards_.size(); ++pos)
    for (const auto& name : c.shards_[pos].names()) {
      auto it = c.shard_index_.find(name);
      if (it == c.shard_index_.end() || it->second != pos)
        fail("{}: shard {} holds tensor {}, which the index does not map to it", index_path, c.shard_files_[pos],
             json_quote_short(name));
    }
  return c;
}

size_t CheckpointFiles::shard_position(const std::string& name) const {
  auto it = shard_index_.find(name);
  if (it == shard_index_.end()) fail("checkpoint {}: no tensor {}", dir_, json_quote_short(name));
  return it->second;
}

Tensor CheckpointFiles::tensor(const std::string& name) const { return shards_[shard_position(name)].tensor(name); }
const SafetensorsInfo& CheckpointFiles::info(const std::string& name) const {
  return shards_[shard_position(name)].info(name);
}
const std::string& CheckpointFiles::shard_of(const std::string& name) const {
  return shard_files_[shard_position(name)];
}

namespace {

struct ShardPlan {
  std::string file;
  std::vector<size_t> members;  // indices into the tensor list
};

// huggingface_hub split_state_dict_into_shards_factory, step for step. NOTE: a tensor larger
// than the limit is appended as its own shard *immediately*, before the shard being filled,
// so it can take a lower shard number than tensors that precede it.
std::vector<ShardPlan> plan_greedy(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t max_bytes) {
  std::vector<ShardPlan> shards;
  ShardPlan current;
  int64_t current_size = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t size = static_cast<int64_t>(tensors[i].second.nbytes());
    if (size > max_bytes) {
      shards.push_back({"", {i}});
      continue;
    }
    if (current_size + size > max_bytes) {
      shards.push_back(std::move(current));
      current = {};
      current_size = 0;
    }
    current.members.push_back(i);
    current_size += size;
  }
  if (!current.members.empty() || shards.empty()) shards.push_back(std::move(current));
  if (shards.size() == 1) {
    shards[0].file = kSingleFile;
  } else {
    for (size_t s = 0; s < shards.size(); ++s)
      shards[s].file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
  }
  return shards;
}

std::vector<ShardPlan> plan_from_mapping(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                         const std::map<std::string, std::string>& shard_of, const std::string& dir) {
  std::vector<ShardPlan> shards;
  std::map<std::string, size_t> pos;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].first;
    auto it = shard_of.find(name);
    if (it == shard_of.end())
      fail("writing checkpoint {}: tensor {} has no entry in the shard mapping", dir, json_quote_short(name));
    const std::string& file = it->second;
    if (!is_plain_filename(file) || !ends_with(file, ".safetensors") || !utf8_valid(file))
      fail("writing checkpoint {}: tensor {} maps to shard {}, expected a plain *.safetensors file name", dir,
           json_quote_short(name), json_quote_short(file));
    auto [p, fresh] = pos.emplace(file, shards.size());
    if (fresh) shards.push_back({file, {}});
    shards[p->second].members.push_back(i);
  }
  return shards;
}

// Python: json.dumps(index, indent=2, sort_keys=True) + "\n".
std::string index_json(int64_t total_parameters, int64_t total_size,
                       const std::map<std::string, std::string>& weight_map) {
  std::string s = "{\n  \"metadata\": {\n";
  s += fmt::format("    \"total_parameters\": {},\n    \"total_size\": {}\n  }},\n", total_parameters, total_size);
  if (weight_map.empty()) return s + "  \"weight_map\": {}\n}\n";
  s += "  \"weight_map\": {\n";
  size_t i = 0;
  for (const auto& [name, file] : weight_map) {
    s += "    " + json_quote_python(name) + ": " + json_quote_python(file);
    s += ++i < weight_map.size() ? ",\n" : "\n";
  }
  return s + "  }\n}\n";
}

}  // namespace

namespace {

// What a save writes: the shards (file, members) and whether an index goes with them; checked up front so
// that a bad tensor fails the save before any shard is written.
struct SavePlan {
  std::vector<ShardPlan> shards;
  bool write_index = false;
  int64_t total_parameters = 0, total_size = 0;
};

SavePlan save_plan(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                   const CheckpointWriteOptions& options) {
  if (options.max_shard_bytes <= 0)
    fail("writing checkpoint {}: max shard size must be positive, found {}", dir, options.max_shard_bytes);
  SavePlan p;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (!seen.insert(name).second) fail("writing checkpoint {}: duplicate tensor {}", dir, json_quote_short(name));
    if (!utf8_valid(name)) fail("writing checkpoint {}: tensor name {} is not valid UTF-8", dir, json_quote_short(name));
    if (!t.defined()) fail("writing checkpoint {}: tensor {} is undefined", dir, json_quote_short(name));
    if (!t.device().is_cpu())
      fail("writing checkpoint {}: tensor {} is on {}, expected cpu", dir, json_quote_short(name), t.device().str());
    p.total_parameters += t.numel();
    p.total_size += static_cast<int64_t>(t.nbytes());
  }
  if (options.total_parameters >= 0) p.total_parameters = options.total_parameters;
  const bool with_index = options.shard_of.has_value();
  p.shards = with_index ? plan_from_mapping(tensors, *options.shard_of, dir) : plan_greedy(tensors, options.max_shard_bytes);
  p.write_index = with_index || p.shards.size() > 1;
  return p;
}

std::vector<std::pair<std::string, Tensor>> shard_members(const ShardPlan& shard,
                                                          const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::pair<std::string, Tensor>> part;
  for (size_t i : shard.members) part.push_back(tensors[i]);
  return part;
}

// Writes the index (when the plan has one) and removes model*.safetensors files and an index of an earlier
// save that this one did not write. Returns the file names of this save, index last.
std::vector<std::string> finish_save(const std::string& dir, const SavePlan& p,
                                     const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::string> written;
  std::map<std::string, std::string> weight_map;
  for (const auto& shard : p.shards) {
    for (size_t i : shard.members) weight_map[tensors[i].first] = shard.file;
    written.push_back(shard.file);
  }
  if (p.write_index) {
    const std::string text = index_json(p.total_parameters, p.total_size, weight_map);
    file_write_atomic(dir + "/" + kIndexFile, {text});
    written.push_back(kIndexFile);
  }
  // Files of an earlier save that this one replaced; a reader must not pick them up.
  const std::set<std::string> keep(written.begin(), written.end());
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string f = it->path().filename().string();
    const bool ours = (f.rfind("model", 0) == 0 && ends_with(f, ".safetensors")) || f == kIndexFile;
    if (ours && !keep.count(f) && !it->is_directory()) {
      std::error_code rm;
      fs::remove(it->path(), rm);
      if (rm) fail("writing checkpoint {}: cannot remove stale {}: {}", dir, f, rm.message());
    }
  }
  if (ec) fail("writing checkpoint {}: cannot list the directory: {}", dir, ec.message());
  return written;
}

// save_pretrained's shard metadata.
const std::map<std::string, std::string> kShardMetadata = {{"format", "pt"}};

void create_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create checkpoint directory {}: {}", dir, ec.message());
}

}  // namespace

std::vector<std::string> checkpoint_write_tensors(const std::string& dir,
                                                  const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                  const CheckpointWriteOptions& options) {
  const SavePlan p = save_plan(dir, tensors, options);
  create_dir(dir);
  for (const auto& shard : p.shards) safetensors_write(dir + "/" + shard.file, shard_members(shard, tensors), kShardMetadata);
  return finish_save(dir, p, tensors);
}

std::vector<std::string> checkpoint_shared_create(const std::string& dir,
                                                  const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                  const CheckpointWriteOptions& options) {
  const SavePlan p = save_plan(dir, tensors, options);
  create_dir(dir);
  for (const auto& shard : p.shards)
    safetensors_shared_create(dir + "/" + shard.file, shard_members(shard, tensors), kShardMetadata);
  return finish_save(dir, p, tensors);
}

void checkpoint_shared_write(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                             const CheckpointWriteOptions& options, const RowsOf& rows_of) {
  const SavePlan p = save_plan(dir, tensors, options);
  for (const auto& shard : p.shards)
    safetensors_shared_write(dir + "/" + shard.file, shard_members(shard, tensors), kShardMetadata, rows_of);
}

int64_t parse_size_bytes(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  const size_t digits_begin = i;
  int64_t n = 0;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i)
    if (__builtin_mul_overflow(n, 10, &n) || __builtin_add_overflow(n, s[i] - '0', &n))
      fail("size {}: number too large", json_quote_short(s));
  if (i == digits_begin) fail("size {}: expected an integer followed by a unit such as \"5GB\"", json_quote_short(s));
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::string unit;
  for (; i < s.size() && !std::isspace(static_cast<unsigned char>(s[i])); ++i)
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  static const std::map<std::string, int64_t> kUnits = {
      {"", 1},
      {"B", 1},
      {"KB", 1000},
      {"MB", 1000'000},
      {"GB", 1000'000'000},
      {"TB", 1000'000'000'000},
      {"KIB", int64_t{1} << 10},
      {"MIB", int64_t{1} << 20},
      {"GIB", int64_t{1} << 30},
      {"TIB", int64_t{1} << 40},
  };
  auto u = kUnits.find(unit);
  if (i != s.size() || u == kUnits.end())
    fail("size {}: unknown unit (expected B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", json_quote_short(s));
  int64_t r;
  if (__builtin_mul_overflow(n, u->second, &r)) fail("size {}: too large", json_quote_short(s));
  return r;
}

}  // namespace mt
