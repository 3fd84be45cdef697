#include "models/causal_lm.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/checkpoint_files.h"
#include "io/hf_cache.h"
#include "models/hf_checkpoint_map.h"
#include "models/registry.h"

namespace mt {

namespace fs = std::filesystem;

const std::vector<std::string>& carried_file_names() {
  static const std::vector<std::string> names = {
      "generation_config.json", "tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json",
      "added_tokens.json",      "vocab.json",      "merges.txt",            "chat_template.jinja",
      "chat_template.json",     "tokenizer.model",
  };
  return names;
}

namespace {

// The dtype all float tensors of a checkpoint share, if they do. The stored forms of a quantised checkpoint
// (F8 weights and their F32 `_scale_inv` block scales) say nothing about the model dtype: they are skipped.
std::optional<DType> uniform_float_dtype(const CheckpointFiles& files, bool quantised) {
  static const std::string kScale = "_scale_inv";
  std::optional<DType> found;
  for (const auto& n : files.names()) {
    DType t = files.info(n).dtype;
    if (!dtype_is_float(t) || dtype_size(t) == 1) continue;
    if (quantised && n.size() > kScale.size() && n.compare(n.size() - kScale.size(), kScale.size(), kScale) == 0)
      continue;
    if (found && *found != t) return std::nullopt;
    found = t;
  }
  return found;
}

void check_trainable_dtype(DType t, const std::string& what) {
  if (t != DType::F32 && t != DType::BF16)
    fail("{}: parameter dtype {} is not supported for training (use float32 or bfloat16)", what,
         dtype_torch_name(t));
}

std::map<std::string, std::string> read_carried_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& name : carried_file_names()) {
    const fs::path from = fs::path(dir) / name;
    if (!fs::is_regular_file(from)) continue;
    std::ifstream in(from, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in.good() && !in.eof()) fail("{}: read failed", from.string());
    out[name] = ss.str();
  }
  return out;
}

// Checked (a full disk names the file and what it needed); the directory is fsynced as a whole.
void write_text(const fs::path& path, const std::string& text) { file_write(path.string(), {text}); }

}  // namespace

CausalLM CausalLM::from_pretrained(const std::string& path_or_repo_id, const LoadOptions& options) {
  const std::string dir = hf_resolve_model_path(path_or_repo_id);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) fail("{}: no config.json in the model directory", dir);
  CausalLM m;
  m.config = DecoderSpec::from_file(config_path);
  architecture_lookup(m.config.architecture, config_path);
  CheckpointFiles files = CheckpointFiles::open(dir);
  const bool quantised = m.config.quant.method != CheckpointQuant::Method::none;
  m.source_dtype = uniform_float_dtype(files, quantised).value_or(m.config.dtype);
  m.dtype = options.dtype.value_or(m.source_dtype);
  check_trainable_dtype(m.dtype, config_path);
  m.weights = ModelWeights::from_hf(
      m.config, m.dtype, [&](const std::string& name) { return files.has(name) ? files.tensor(name) : Tensor(); },
      files.names(), dir, options.expert_first, options.expert_count, options.skip_param, options.compact_experts,
      [&](const std::string& name) { return (fs::path(dir) / files.shard_of(name)).string(); });
  m.experts_partial = options.expert_count >= 0 && options.expert_count < m.config.num_experts();
  if (options.compact_experts && options.expert_count >= 0) m.expert_first = options.expert_first;
  m.params_partial = static_cast<bool>(options.skip_param);
  m.source_dir = dir;
  m.carried_files = read_carried_files(dir);
  // A quantised source's sharding does not describe the (larger) dequantised tensors: save shards afresh.
  if (!quantised && (!files.index_metadata().empty() || files.shard_files().size() > 1))
    for (const auto& n : files.names()) m.source_shard_of[n] = files.shard_of(n);
  m.config.dtype = m.dtype;
  m.config.quant = {};  // dequantised: the model in memory (and every save) is float
  return m;
}

CausalLM CausalLM::from_config(const DecoderSpec& config, DType dtype, uint64_t seed) {
  check_trainable_dtype(dtype, "init");
  CausalLM m;
  m.config = config;
  m.config.dtype = dtype;
  m.dtype = dtype;
  m.source_dtype = dtype;
  m.weights = ModelWeights::random_init(m.config, dtype, seed);
  return m;
}

void CausalLM::cast(DType dtype) {
  check_trainable_dtype(dtype, "cast");
  if (dtype == this->dtype) return;
  for (auto& [name, t] : weights.named_parameters()) *t = t->to(dtype);
  this->dtype = dtype;
  config.dtype = dtype;
}

std::map<std::string, std::string> hf_shard_mapping(const std::vector<std::pair<std::string, Tensor>>& ordered,
                                                    const std::vector<int64_t>& storage_units,
                                                    int64_t max_shard_bytes) {
  // Transformers' reverted expert tensors are views sharing one storage (HfNameMap::saved_storage_units);
  // huggingface_hub's split_torch_state_dict_into_shards places each storage as one unit (sized by the whole
  // storage) where its first tensor falls, and gives a unit larger than the limit a shard of its own.
  MT_CHECK(storage_units.size() == ordered.size(), "{} storage units for {} tensors", storage_units.size(),
           ordered.size());
  struct Unit {
    std::vector<std::string> names;
    int64_t bytes = 0;
  };
  std::vector<Unit> units;
  for (size_t i = 0; i < ordered.size(); ++i) {
    if (i == 0 || storage_units[i] != storage_units[i - 1]) units.emplace_back();
    units.back().names.push_back(ordered[i].first);
    units.back().bytes += static_cast<int64_t>(ordered[i].second.nbytes());
  }
  std::vector<std::vector<const Unit*>> shards;
  std::vector<const Unit*> current;
  int64_t current_bytes = 0;
  for (const Unit& u : units) {
    if (u.bytes > max_shard_bytes) {
      shards.push_back({&u});
      continue;
    }
    if (current_bytes + u.bytes > max_shard_bytes) {
      shards.push_back(current);
      current.clear();
      current_bytes = 0;
    }
    current.push_back(&u);
    current_bytes += u.bytes;
  }
  if (!current.empty()) shards.push_back(current);
  std::map<std::string, std::string> shard_of;
  if (shards.size() <= 1) return shard_of;  // one shard: model.safetensors without an index
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    for (const Unit* u : shards[i])
      for (const auto& n : u->names) shard_of[n] = file;
  }
  return shard_of;
}

void CausalLM::save_pretrained(const std::string& dir, const SaveOptions& options) const {
  AtomicDirWriter out(dir);
  write_pretrained_files(out.path(), options);
  out.commit();
}

CausalLM::SaveLayout CausalLM::save_layout(const SaveOptions& options) const {
  // The family's rules give the names, the tensors and save_pretrained's order.
  SaveLayout l;
  auto& tensors = l.tensors;
  tensors = weights.to_hf(config, expert_first);
  CheckpointWriteOptions& wo = l.write;
  wo.max_shard_bytes = std::numeric_limits<int64_t>::max();
  wo.total_parameters = param_counts(weights.param_table()).total;  // num_parameters(): buffers left out
  // The source layout is reused only when it still describes these tensors (same names, same dtype).
  if (options.reuse_source_sharding && !options.max_shard_bytes && !source_shard_of.empty() &&
      dtype == source_dtype) {
    bool covers = true;
    for (const auto& [n, t] : tensors) covers = covers && source_shard_of.count(n);
    if (covers) wo.shard_of = source_shard_of;
  }
  if (!wo.shard_of) {
    const auto units = hf_name_map_of(config, weights.param_table(), dtype).saved_storage_units();
    auto mapping = hf_shard_mapping(tensors, units, options.max_shard_bytes.value_or(50'000'000'000));
    if (!mapping.empty()) wo.shard_of = std::move(mapping);
  }
  return l;
}

void CausalLM::write_metadata_files(const std::string& dir) const {
  DecoderSpec cfg = config;
  cfg.dtype = dtype;
  write_text(fs::path(dir) / "config.json", cfg.to_json().dump(2) + "\n");
  // Files held since load (the source directory may be gone by now, e.g. a pruned training checkpoint),
  // else those present in source_dir.
  const auto carried = carried_files.empty() && !source_dir.empty() ? read_carried_files(source_dir) : carried_files;
  bool have_generation_config = false;
  for (const auto& [name, bytes] : carried) {
    write_text(fs::path(dir) / name, bytes);
    have_generation_config = have_generation_config || name == "generation_config.json";
  }
  if (!have_generation_config) {
    nlohmann::json g = {{"_from_model_config", true}};
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (config.raw.contains(k) && !config.raw[k].is_null()) g[k] = config.raw[k];
    write_text(fs::path(dir) / "generation_config.json", g.dump(2) + "\n");
  }
}

void CausalLM::write_pretrained_files(const std::string& dir, const SaveOptions& options) const {
  if (experts_partial)
    fail("{}: cannot save a model loaded with only some of its experts (LoadOptions::expert_count)", dir);
  if (params_partial)
    fail("{}: cannot save a model loaded without some of its parameters (LoadOptions::skip_param)", dir);
  const SaveLayout l = save_layout(options);
  write_metadata_files(dir);
  checkpoint_write_tensors(dir, l.tensors, l.write);
}

void CausalLM::write_pretrained_layout(const std::string& dir, const SaveOptions& options) const {
  const SaveLayout l = save_layout(options);
  write_metadata_files(dir);
  checkpoint_shared_create(dir, l.tensors, l.write);
}

void CausalLM::write_pretrained_rows(const std::string& dir, const RowsOf& rows_of, const SaveOptions& options) const {
  const SaveLayout l = save_layout(options);
  checkpoint_shared_write(dir, l.tensors, l.write, rows_of);
}

}  // namespace mt
