// Recipe parsing: the YAML tree is checked against a fixed schema (sections -> keys) so a typo
// is an error rather than a silently ignored setting; --set overrides edit the tree before that.
#include "train/recipe.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace mt {
namespace {

struct Section {
  const char* name;
  std::vector<std::string> keys;
};

const std::vector<Section>& recipe_schema() {
  static const std::vector<Section> s = {
      {"model", {"path", "dtype", "adapter"}},
      {"data", {"train", "eval", "seq_len", "pack", "truncation", "skip_bad_lines", "tokenizer"}},
      {"train", {"micro_batch_size", "grad_accum", "max_steps", "epochs", "seed", "device", "eval_every",
                 "log_every", "max_nonfinite_steps", "recompute", "deterministic"}},
      {"optimizer", {"name", "lr", "betas", "eps", "weight_decay", "master_weights", "moment_dtype", "expert_grad_dtype",
                     "decay_norms_and_biases"}},
      {"schedule", {"name", "warmup_steps", "min_lr_ratio"}},
      {"clip", {"max_grad_norm"}},
      {"checkpoint", {"dir", "every_steps", "keep_last"}},
      {"parallel",
       {"timeout_s", "ep", "ep_dispatch", "ep_row_headroom", "shard_optimizer", "shard_parameters", "reshard_after_forward", "gpu_collectives"}},
      {"peft", {"method", "r", "alpha", "dropout", "target", "use_rslora"}},
      {"moe", {"bias_update_rate"}},
  };
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const auto& s : recipe_schema()) out.push_back(s.name);
  return out;
}

const Section* section_find(const std::string& name) {
  for (const auto& s : recipe_schema())
    if (name == s.name) return &s;
  return nullptr;
}

bool key_known(const Section& s, const std::string& key) {
  for (const auto& k : s.keys)
    if (k == key) return true;
  return false;
}

// How a node looked, for "(found '...')" in messages.
std::string node_show(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "null";
}

// Reads typed values out of the tree, naming file and key path on failure.
class RecipeReader {
 public:
  RecipeReader(std::string file, YAML::Node root) : file_(std::move(file)), root_(std::move(root)) {}

  YAML::Node get(const char* sec, const char* key) const {
    YAML::Node s = root_[sec];
    if (!s) return YAML::Node();
    return s[key];
  }

  [[noreturn]] void bad(const char* sec, const char* key, const std::string& what, const YAML::Node& n) const {
    fail("{}: {}.{}: {} (found '{}')", file_, sec, key, what, node_show(n));
  }

  std::string str(const char* sec, const char* key, std::string def, bool required = false) const {
    YAML::Node n = get(sec, key);
    if (!n || n.IsNull()) {
      if (required) fail("{}: {}.{}: required key is missing", file_, sec, key);
      return def;
    }
    if (!n.IsScalar() || n.Scalar().empty()) bad(sec, key, "must be a non-empty string", n);
    return n.Scalar();
  }

  std::string choice(const char* sec, const char* key, std::string def, const std::vector<std::string>& valid) const {
    std::string v = str(sec, key, def);
    for (const auto& c : valid)
      if (v == c) return v;
    bad(sec, key, "must be one of " + join(valid), get(sec, key));
  }

  // An integer >= min, and <= max when max is given (sizes whose products must not overflow or wait forever).
  int64_t integer(const char* sec, const char* key, int64_t def, int64_t min,
                  int64_t max = std::numeric_limits<int64_t>::max()) const {
    YAML::Node n = get(sec, key);
    if (!n || n.IsNull()) return def;
    int64_t v = 0;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v) || v < min || v > max)
      bad(sec, key,
          max == std::numeric_limits<int64_t>::max() ? fmt::format("must be an integer >= {}", min)
                                                     : fmt::format("must be an integer in {}..{}", min, max),
          n);
    return v;
  }

  bool boolean(const char* sec, const char* key, bool def) const {
    YAML::Node n = get(sec, key);
    if (!n || n.IsNull()) return def;
    bool v = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) bad(sec, key, "must be true or false", n);
    return v;
  }

  // One number in [lo, hi] (or (lo, hi] when lo_open), checked with the given wording.
  double real_of(const YAML::Node& n, const char* sec, const char* key, double lo, bool lo_open, double hi,
                 bool hi_open, const std::string& what) const {
    double v = 0;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !(v == v) || (lo_open ? v <= lo : v < lo) ||
        (hi_open ? v >= hi : v > hi))
      bad(sec, key, what, n);
    return v;
  }

  double real(const char* sec, const char* key, double def, double lo, bool lo_open, double hi, bool hi_open,
              const std::string& what) const {
    YAML::Node n = get(sec, key);
    if (!n || n.IsNull()) return def;
    return real_of(n, sec, key, lo, lo_open, hi, hi_open, what);
  }

  const std::string& file() const { return file_; }

 private:
  std::string file_;
  YAML::Node root_;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

// Every section must be a mapping and every key must be in the schema.
void recipe_check_keys(const std::string& file, const YAML::Node& root) {
  if (!root.IsMap()) fail("{}: the recipe must be a mapping of sections (found {})", file, node_show(root));
  for (const auto& kv : root) {
    const std::string name = kv.first.as<std::string>();
    const Section* sec = section_find(name);
    if (!sec) fail("{}: unknown section '{}' (valid sections: {})", file, name, join(section_names()));
    if (kv.second.IsNull()) continue;
    if (!kv.second.IsMap()) fail("{}: {}: must be a mapping of keys (found {})", file, name, node_show(kv.second));
    for (const auto& kk : kv.second) {
      const std::string key = kk.first.as<std::string>();
      if (!key_known(*sec, key))
        fail("{}: unknown key '{}.{}' (valid keys in '{}': {})", file, name, key, name, join(sec->keys));
    }
  }
}

void recipe_apply_set(const std::string& file, YAML::Node& root, const std::string& set) {
  const auto eq = set.find('=');
  if (eq == std::string::npos) fail("{}: --set '{}': expected section.key=value", file, set);
  const std::string path = set.substr(0, eq);
  const auto dot = path.find('.');
  const std::string name = path.substr(0, dot);
  const std::string key = dot == std::string::npos ? "" : path.substr(dot + 1);
  const Section* sec = section_find(name);
  if (!sec) fail("{}: --set '{}': unknown section '{}' (valid sections: {})", file, set, name, join(section_names()));
  if (!key_known(*sec, key))
    fail("{}: --set '{}': unknown key '{}' (valid keys in '{}': {})", file, set, path, name, join(sec->keys));
  YAML::Node value;
  try {
    value = YAML::Load(set.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    fail("{}: --set '{}': value is not valid YAML: {}", file, set, e.msg);
  }
  if (!root[name] || root[name].IsNull()) root[name] = YAML::Node(YAML::NodeType::Map);
  if (!root[name].IsMap()) fail("{}: {}: must be a mapping of keys (found {})", file, name, node_show(root[name]));
  root[name][key] = value;
}

// The peft section: LoRA's settings. The target names are the model family's (checked when the model is loaded,
// models/lora_adapter.h); here only their form.
void recipe_read_peft(const RecipeReader& r, const YAML::Node& root, Recipe& rc) {
  RecipePeft& p = rc.peft;
  const YAML::Node sec = root["peft"];
  p.enabled = (sec && !sec.IsNull()) || !rc.model.adapter.empty();
  if (!sec || sec.IsNull()) return;
  p.method = r.choice("peft", "method", p.method, {"lora"});
  p.r = r.integer("peft", "r", p.r, 1, int64_t{1} << 20);
  p.alpha = r.real("peft", "alpha", p.alpha, 0, true, kInf, true, "must be a number > 0");
  p.dropout = r.real("peft", "dropout", p.dropout, 0, false, 1, true, "must be a number in [0, 1)");
  if (p.dropout != 0.0)
    r.bad("peft", "dropout", "must be 0: LoRA dropout is not implemented (PEFT refuses it for expert parameters too)",
          r.get("peft", "dropout"));
  p.use_rslora = r.boolean("peft", "use_rslora", p.use_rslora);
  const YAML::Node t = r.get("peft", "target");
  if (!t || t.IsNull()) {
    if (rc.model.adapter.empty()) fail("{}: peft.target: required key is missing", r.file());
    return;  // the saved adapter's targets
  }
  if (!t.IsSequence() || t.size() == 0) r.bad("peft", "target", "must be a non-empty list of target names", t);
  for (const YAML::Node& n : t) {
    if (!n.IsScalar() || n.Scalar().empty()) r.bad("peft", "target", "each target must be a non-empty name", n);
    p.target.push_back(n.Scalar());
  }
}

}  // namespace

Recipe recipe_load(const std::string& path, const std::vector<std::string>& sets) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open recipe file", path);
  std::stringstream buf;
  buf << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(buf.str());
  } catch (const YAML::ParserException& e) {
    fail("{}:{}:{}: YAML syntax error: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  } catch (const YAML::Exception& e) {
    fail("{}: cannot parse YAML: {}", path, e.msg);
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);  // empty file: required keys report below
  if (!root.IsMap()) fail("{}: the recipe must be a mapping of sections (found {})", path, node_show(root));
  for (const auto& s : sets) recipe_apply_set(path, root, s);
  recipe_check_keys(path, root);

  const RecipeReader r(path, root);
  Recipe rc;
  rc.file = path;
  rc.model.path = r.str("model", "path", "", true);
  rc.model.dtype = r.choice("model", "dtype", rc.model.dtype, {"bfloat16", "float32"});
  rc.model.adapter = r.str("model", "adapter", "");

  rc.data.train = r.str("data", "train", "", true);
  rc.data.eval = r.str("data", "eval", "");
  rc.data.seq_len = r.integer("data", "seq_len", rc.data.seq_len, 1, kMaxSeqLen);
  rc.data.pack = r.boolean("data", "pack", rc.data.pack);
  rc.data.truncation = r.choice("data", "truncation", rc.data.truncation, {"right", "drop"});
  rc.data.skip_bad_lines = r.boolean("data", "skip_bad_lines", rc.data.skip_bad_lines);
  rc.data.tokenizer = r.str("data", "tokenizer", rc.data.tokenizer);

  rc.train.micro_batch_size = r.integer("train", "micro_batch_size", rc.train.micro_batch_size, 1, kMaxMicroBatch);
  rc.train.grad_accum = r.integer("train", "grad_accum", rc.train.grad_accum, 1, kMaxGradAccum);
  rc.train.max_steps = r.integer("train", "max_steps", rc.train.max_steps, 0);
  rc.train.epochs = r.integer("train", "epochs", rc.train.epochs, 1);
  rc.train.seed = static_cast<uint64_t>(r.integer("train", "seed", static_cast<int64_t>(rc.train.seed), 0));
  rc.train.device = r.str("train", "device", rc.train.device);
  {
    const std::string& d = rc.train.device;
    bool ok = d == "auto" || d == "cpu" || d == "cuda";
    if (!ok && d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() <= 8) {
      ok = true;
      for (size_t i = 5; i < d.size(); ++i) ok = ok && d[i] >= '0' && d[i] <= '9';
    }
    if (!ok) r.bad("train", "device", "must be one of auto, cpu, cuda, cuda:N", r.get("train", "device"));
  }
  rc.train.eval_every = r.integer("train", "eval_every", rc.train.eval_every, 0);
  rc.train.log_every = r.integer("train", "log_every", rc.train.log_every, 1);
  rc.train.max_nonfinite_steps = r.integer("train", "max_nonfinite_steps", rc.train.max_nonfinite_steps, 1);
  rc.train.recompute = r.choice("train", "recompute", rc.train.recompute, {"none", "selective", "full"});
  rc.train.deterministic = r.boolean("train", "deterministic", rc.train.deterministic);

  rc.optimizer.name = r.choice("optimizer", "name", rc.optimizer.name, {"adamw"});
  rc.optimizer.lr = r.real("optimizer", "lr", rc.optimizer.lr, 0, true, kInf, true, "must be a number > 0");
  if (YAML::Node b = r.get("optimizer", "betas"); b && !b.IsNull()) {
    if (!b.IsSequence() || b.size() != 2) r.bad("optimizer", "betas", "must be a list [beta1, beta2]", b);
    const std::string what = "each beta must be a number in [0, 1)";
    rc.optimizer.beta1 = r.real_of(b[0], "optimizer", "betas", 0, false, 1, true, what);
    rc.optimizer.beta2 = r.real_of(b[1], "optimizer", "betas", 0, false, 1, true, what);
  }
  rc.optimizer.eps = r.real("optimizer", "eps", rc.optimizer.eps, 0, true, kInf, true, "must be a number > 0");
  rc.optimizer.weight_decay =
      r.real("optimizer", "weight_decay", rc.optimizer.weight_decay, 0, false, kInf, true, "must be a number >= 0");
  rc.optimizer.master_weights =
      r.choice("optimizer", "master_weights", rc.optimizer.master_weights, {"float32", "none"});
  rc.optimizer.moment_dtype =
      r.choice("optimizer", "moment_dtype", rc.optimizer.moment_dtype, {"float32", "bfloat16"});
  rc.optimizer.expert_grad_dtype =
      r.choice("optimizer", "expert_grad_dtype", rc.optimizer.expert_grad_dtype, {"float32", "bfloat16"});
  rc.optimizer.decay_norms_and_biases =
      r.boolean("optimizer", "decay_norms_and_biases", rc.optimizer.decay_norms_and_biases);

  rc.schedule.name = r.choice("schedule", "name", rc.schedule.name, {"constant", "linear", "cosine"});
  rc.schedule.warmup_steps = r.integer("schedule", "warmup_steps", rc.schedule.warmup_steps, 0);
  rc.schedule.min_lr_ratio =
      r.real("schedule", "min_lr_ratio", rc.schedule.min_lr_ratio, 0, false, 1, false, "must be a number in [0, 1]");

  rc.clip.max_grad_norm =
      r.real("clip", "max_grad_norm", rc.clip.max_grad_norm, 0, false, kInf, true, "must be a number >= 0");

  rc.checkpoint.dir = r.str("checkpoint", "dir", "", true);
  rc.checkpoint.every_steps = r.integer("checkpoint", "every_steps", rc.checkpoint.every_steps, 0);
  rc.checkpoint.keep_last = r.integer("checkpoint", "keep_last", rc.checkpoint.keep_last, 1);

  rc.parallel.timeout_s = r.integer("parallel", "timeout_s", rc.parallel.timeout_s, 1, kMaxTimeoutS);
  rc.parallel.ep = r.integer("parallel", "ep", rc.parallel.ep, 1);
  rc.parallel.ep_dispatch =
      r.choice("parallel", "ep_dispatch", rc.parallel.ep_dispatch, {"auto", "all_gather", "all_to_all"});
  rc.parallel.ep_row_headroom =
      r.real("parallel", "ep_row_headroom", rc.parallel.ep_row_headroom, 0, false, 16, false,
             "must be 0 (count the expert rows on the host) or a number in (0, 16]");
  rc.parallel.gpu_collectives = r.choice("parallel", "gpu_collectives", rc.parallel.gpu_collectives, {"nccl", "host"});
  rc.parallel.shard_optimizer = r.boolean("parallel", "shard_optimizer", rc.parallel.shard_optimizer);
  rc.parallel.shard_parameters = r.boolean("parallel", "shard_parameters", rc.parallel.shard_parameters);
  rc.parallel.reshard_after_forward =
      r.boolean("parallel", "reshard_after_forward", rc.parallel.reshard_after_forward);
  recipe_read_peft(r, root, rc);
  rc.moe.bias_update_rate = r.real("moe", "bias_update_rate", rc.moe.bias_update_rate, 0, false, kInf, true,
                                   "must be a finite number >= 0");
  if (rc.moe.bias_update_rate > 0 && rc.peft.enabled)
    fail("{}: moe.bias_update_rate: LoRA training keeps the base model frozen, and the selection bias is part of it "
         "(an adapter checkpoint does not carry it); set 0, or train in full (no peft section)",
         path);
  if (rc.parallel.shard_parameters && !rc.parallel.shard_optimizer)
    fail("{}: parallel.shard_parameters: needs parallel.shard_optimizer true (the rank that keeps a parameter "
         "also keeps its optimizer state and updates it)",
         path);
  return rc;
}

}  // namespace mt
