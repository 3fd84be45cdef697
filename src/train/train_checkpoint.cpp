#include "train/train_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "io/safetensors_shared.h"
#include "models/model_weights.h"
#include "train/run_dir.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

constexpr const char* kStateFormat = "mixtune-trainer-state-1";
constexpr const char* kPrefix = "checkpoint-";

std::string checkpoint_name(int64_t step) { return train_checkpoint_name(step); }
int64_t checkpoint_step(const std::string& name) { return train_checkpoint_dir_step(name); }

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("{}: cannot open", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void prune(const fs::path& run_dir, const std::string& keep_name, int64_t keep_last) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& e : fs::directory_iterator(run_dir)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    const int64_t step = checkpoint_step(name);
    if (step >= 0) found.emplace_back(step, name);
  }
  std::sort(found.begin(), found.end());
  int64_t excess = static_cast<int64_t>(found.size()) - keep_last;
  for (const auto& [step, name] : found) {
    if (excess <= 0) break;
    if (name == keep_name) continue;
    // Renamed first: a process killed while removing leaves a leftover the next run sweeps
    // (train/run_dir.h), never a partial directory under a complete checkpoint's name.
    const fs::path doomed = run_dir / fmt::format("{}.old.{}", name, ::getpid());
    std::error_code ec;
    fs::rename(run_dir / name, doomed, ec);
    if (ec) fail("{}: cannot remove old checkpoint: {}", (run_dir / name).string(), ec.message());
    fs::remove_all(doomed, ec);
    if (ec) fail("{}: cannot remove old checkpoint: {}", doomed.string(), ec.message());
    --excess;
  }
}

constexpr const char* kOptimizerFile = "optimizer.safetensors";

std::map<std::string, std::string> optimizer_metadata() { return {{"format", "mixtune-adamw"}}; }

void write_trainer_state(const std::string& dir, const TrainerState& state) {
  nlohmann::ordered_json j;
  j["format"] = kStateFormat;
  j["step"] = state.step;
  j["optimizer_steps"] = state.optimizer_steps;
  j["loader"] = {{"epoch", state.loader.epoch}, {"cursor", state.loader.cursor}};
  j["nonfinite_streak"] = state.nonfinite_streak;
  j["tokens_seen"] = state.tokens_seen;
  j["identity"] = state.identity;
  const std::string text = j.dump(2) + "\n";
  file_write_atomic((fs::path(dir) / "trainer_state.json").string(), {text});
}

// The end of a failed save's message: where a resume continues.
std::string latest_now(const std::string& run_dir) {
  std::error_code ec;
  const fs::path pointer = fs::path(run_dir) / "latest";
  if (!fs::exists(pointer, ec)) return "the run has no checkpoint yet";
  std::ifstream in(pointer, std::ios::binary);
  std::string name;
  std::getline(in, name);
  return fmt::format("latest still names {}, where --resume continues", name);
}

// Every error of a save gets its context: which checkpoint, how large, and what `latest` names now.
template <typename F>
void save_or_explain(const std::string& run_dir, const std::string& name, uint64_t bytes, F&& save) {
  try {
    save();
  } catch (const Error& e) {
    fail("saving {} (about {}) in {} failed: {}; {}", name, bytes_text(bytes), run_dir, e.what(), latest_now(run_dir));
  }
}

// `latest` moves only after the checkpoint directory is complete and in place.
void point_latest_and_prune(const std::string& run_dir, const std::string& name, int64_t keep_last) {
  const std::string pointer = name + "\n";
  file_write_atomic((fs::path(run_dir) / "latest").string(), {pointer});
  prune(run_dir, name, keep_last);
}

}  // namespace

std::string train_checkpoint_name(int64_t step) { return fmt::format("{}{:06d}", kPrefix, step); }

int64_t train_checkpoint_dir_step(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(std::strlen(kPrefix));
  if (digits.empty() || digits.size() > 15) return -1;
  for (char c : digits)
    if (c < '0' || c > '9') return -1;
  return std::stoll(digits);
}

uint64_t train_checkpoint_bytes(const CausalLM& model, const std::vector<std::pair<std::string, Tensor>>& optimizer_state) {
  uint64_t b = static_cast<uint64_t>(ModelWeights::absent_like_config(model.config, model.dtype).parameter_count()) *
               dtype_size(model.dtype);
  for (const auto& [name, t] : optimizer_state) b += t.nbytes();
  return b + (1u << 16);  // headers, index, config and state files
}

std::string train_checkpoint_save(const std::string& run_dir, const CausalLM& model, AdamW& optimizer,
                                  const TrainerState& state, int64_t keep_last) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [n, t] : optimizer.named_state()) tensors.emplace_back(n, *t);
  return train_checkpoint_save(run_dir, model, tensors, state, keep_last);
}

std::string train_checkpoint_save(const std::string& run_dir, const CausalLM& model,
                                  const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const TrainerState& state, int64_t keep_last) {
  const std::string name = checkpoint_name(state.step);
  const fs::path final_dir = fs::path(run_dir) / name;
  save_or_explain(run_dir, name, train_checkpoint_bytes(model, tensors), [&] {
    {
      AtomicDirWriter out(final_dir.string());  // removes its temp directory if anything below throws
      model.write_pretrained_files(out.path());
      safetensors_write((fs::path(out.path()) / kOptimizerFile).string(), tensors, optimizer_metadata());
      write_trainer_state(out.path(), state);
      out.commit();
    }
    point_latest_and_prune(run_dir, name, keep_last);
  });
  return final_dir.string();
}

std::string train_checkpoint_save(const std::string& run_dir, const std::function<void(const std::string&)>& write_model,
                                  uint64_t model_bytes, const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const TrainerState& state, int64_t keep_last) {
  const std::string name = checkpoint_name(state.step);
  const fs::path final_dir = fs::path(run_dir) / name;
  uint64_t bytes = model_bytes + (1u << 16);
  for (const auto& [n, t] : tensors) bytes += t.nbytes();
  save_or_explain(run_dir, name, bytes, [&] {
    {
      AtomicDirWriter out(final_dir.string());
      write_model(out.path());
      safetensors_write((fs::path(out.path()) / kOptimizerFile).string(), tensors, optimizer_metadata());
      write_trainer_state(out.path(), state);
      out.commit();
    }
    point_latest_and_prune(run_dir, name, keep_last);
  });
  return final_dir.string();
}

std::string train_checkpoint_save_shared(const SaveShare& share, const std::string& run_dir, const CausalLM& model,
                                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                                         const TrainerState& state, int64_t keep_last) {
  const std::string name = checkpoint_name(state.step);
  const fs::path final_dir = fs::path(run_dir) / name;
  save_or_explain(run_dir, name, train_checkpoint_bytes(model, tensors), [&] {
    shared_dir_save(
        share, final_dir.string(),
        [&](const std::string& tmp) {
          model.write_pretrained_layout(tmp);
          safetensors_shared_create((fs::path(tmp) / kOptimizerFile).string(), tensors, optimizer_metadata());
          write_trainer_state(tmp, state);
        },
        [&](const std::string& tmp) {
          model.write_pretrained_rows(tmp, [&](const std::string& n, const Tensor& t) { return share.model_rows(n, t); });
          safetensors_shared_write((fs::path(tmp) / kOptimizerFile).string(), tensors, optimizer_metadata(),
                                   [&](const std::string& n, const Tensor& t) { return share.state_rows(n, t); });
        },
        [&] { point_latest_and_prune(run_dir, name, keep_last); });
  });
  return final_dir.string();
}

std::string train_checkpoint_latest(const std::string& run_dir) {
  const fs::path pointer = fs::path(run_dir) / "latest";
  if (!fs::exists(pointer)) return "";
  std::string name = read_file(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (checkpoint_step(name) < 0) fail("{}: does not name a checkpoint directory (found '{}')", pointer.string(), name);
  const fs::path dir = fs::path(run_dir) / name;
  for (const char* f : {"trainer_state.json", "optimizer.safetensors"})
    if (!fs::is_regular_file(dir / f)) fail("{}: {} is missing: the checkpoint is incomplete", dir.string(), f);
  // The model (config.json), or a LoRA run's adapter (adapter_config.json).
  if (!fs::is_regular_file(dir / "config.json") && !fs::is_regular_file(dir / "adapter_config.json"))
    fail("{}: config.json is missing: the checkpoint is incomplete", dir.string());
  return dir.string();
}

TrainerState train_state_read(const std::string& checkpoint_dir) {
  const fs::path p = fs::path(checkpoint_dir) / "trainer_state.json";
  const std::string where = p.string();
  const nlohmann::ordered_json j = json_parse_strict(read_file(p), where);
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  auto field = [&](const char* key) -> const nlohmann::ordered_json& {
    if (!j.contains(key)) fail("{}: {}: missing", where, key);
    return j[key];
  };
  auto integer = [&](const nlohmann::ordered_json& v, const std::string& key) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail("{}: {}: expected an integer >= 0, found {}", where, key, v.dump());
    return v.get<int64_t>();
  };
  if (field("format") != kStateFormat)
    fail("{}: format: expected \"{}\", found {}", where, kStateFormat, field("format").dump());
  TrainerState s;
  s.step = integer(field("step"), "step");
  s.optimizer_steps = integer(field("optimizer_steps"), "optimizer_steps");
  const auto& loader = field("loader");
  if (!loader.is_object() || !loader.contains("epoch") || !loader.contains("cursor"))
    fail("{}: loader: expected {{\"epoch\": N, \"cursor\": N}}", where);
  s.loader.epoch = integer(loader["epoch"], "loader.epoch");
  s.loader.cursor = integer(loader["cursor"], "loader.cursor");
  s.nonfinite_streak = integer(field("nonfinite_streak"), "nonfinite_streak");
  s.tokens_seen = integer(field("tokens_seen"), "tokens_seen");
  s.identity = nlohmann::json::parse(field("identity").dump());
  return s;
}

void optimizer_state_read(const std::string& checkpoint_dir, AdamW& optimizer) {
  optimizer_state_read(checkpoint_dir, optimizer.named_state());
}

void optimizer_state_read(const std::string& checkpoint_dir, const std::vector<std::pair<std::string, Tensor*>>& state,
                          const ParamTable* params, int64_t expert_first, int64_t expert_count, int64_t file_tensors) {
  MT_CHECK(expert_count < 0 || params, "optimizer_state_read: an expert range needs the parameter table");
  const std::string path = (fs::path(checkpoint_dir) / "optimizer.safetensors").string();
  SafetensorsFile f = SafetensorsFile::open(path);
  for (auto& [name, dst] : state) {
    if (!f.has(name)) fail("{}: tensor '{}' is missing", path, name);
    const SafetensorsInfo& info = f.info(name);
    const bool rows = expert_count >= 0 && param_is_stacked_expert(*params, name);
    Shape want = dst->shape();
    if (rows && !info.shape.empty()) want[0] = info.shape[0];  // the file holds every expert
    if (info.dtype != dst->dtype() || info.shape != want || (rows && (dst->shape().empty() ||
                                                                     dst->dim(0) != expert_count ||
                                                                     expert_first + expert_count > want[0])))
      fail("{}: tensor '{}' is {} {} (expected {} {})", path, name, dtype_safetensors_name(info.dtype),
           shape_str(info.shape), dtype_safetensors_name(dst->dtype()), shape_str(rows ? want : dst->shape()));
    // memcpy: the mapped bytes need not be aligned for float loads. Only the copied rows' pages are read.
    const Tensor src = rows ? f.tensor(name).rows(expert_first, expert_first + expert_count) : f.tensor(name);
    std::memcpy(dst->data(), src.data(), dst->nbytes());
  }
  const size_t expected = file_tensors >= 0 ? static_cast<size_t>(file_tensors) : state.size();
  if (f.names().size() != expected)
    fail("{}: holds {} tensors, the optimizer has {} (a different model or master_weights setting?)", path,
         f.names().size(), expected);
}

}  // namespace mt
