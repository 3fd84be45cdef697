#include "models/lora_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "models/registry.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

constexpr const char* kPeftPrefix = "base_model.model.";
constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

std::string module_of(const std::string& param) {
  const std::string w = ".weight", b = ".bias";
  auto ends = [&](const std::string& s) {
    return param.size() > s.size() && param.compare(param.size() - s.size(), s.size(), s) == 0;
  };
  if (ends(w)) return param.substr(0, param.size() - w.size());
  if (ends(b)) return param.substr(0, param.size() - b.size());
  return param;
}

std::string basename_of(const std::string& dotted) {
  const auto dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

// "model.layers.3.mlp.experts.gate_up_proj" -> "mlp.experts.gate_up_proj" (PEFT's target_parameters suffix).
std::string without_layer_prefix(const std::string& name) {
  const auto at = name.find("layers.");
  if (at == std::string::npos) return name;
  size_t i = at + 7;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  return i < name.size() && name[i] == '.' ? name.substr(i + 1) : name;
}

// How PEFT's config spells one of the family's targets: module names (target_modules / modules_to_save) or
// parameter suffixes (target_parameters).
struct PeftSpelling {
  const LoraTargetDef* def = nullptr;
  std::vector<std::string> modules, parameters;
};

std::vector<PeftSpelling> peft_spellings(const DecoderSpec& spec, const std::vector<LoraTargetDef>& defs) {
  const ParamTable base = param_table_of(spec);
  std::vector<PeftSpelling> out;
  for (const LoraTargetDef& d : defs) {
    PeftSpelling sp;
    sp.def = &d;
    for (int slot : d.slots)
      for (const ParamEntry& e : base.entries()) {
        if (e.layer < 0 || e.slot != slot) continue;
        if (!d.full && (e.role == ParamRole::expert_stack || d.peft_as_parameter))
          sp.parameters.push_back(without_layer_prefix(e.name));
        else
          sp.modules.push_back(basename_of(module_of(e.name)));
        break;
      }
    auto unique = [](std::vector<std::string>& v) {
      std::vector<std::string> u;
      for (const auto& s : v)
        if (std::find(u.begin(), u.end(), s) == u.end()) u.push_back(s);
      v = u;
    };
    unique(sp.modules);
    out.push_back(sp);
  }
  return out;
}

// The PEFT key of an adapter entry. Expert stacks: one ParamWrapper per targeted parameter of the experts module,
// nested in registration order (the base table's order), the first innermost: "base_layer." once per wrapper
// around it.
std::string peft_name(const LoraTable& t, const LoraEntry& e) {
  const std::string ab = e.is_b ? "lora_B.weight" : "lora_A.weight";
  if (e.role != ParamRole::expert_stack) return kPeftPrefix + e.name;
  std::vector<std::string> stacks;  // this layer's targeted stacks of the same module, in table order
  const std::string module = e.base.substr(0, e.base.rfind('.'));  // "model.layers.N.mlp.experts"
  for (const LoraEntry& o : t.entries)
    if (!o.is_b && o.role == ParamRole::expert_stack && o.layer == e.layer &&
        o.base.compare(0, module.size() + 1, module + ".") == 0)
      stacks.push_back(o.base);
  const auto pos = std::find(stacks.begin(), stacks.end(), e.base) - stacks.begin();
  std::string wrappers;
  for (auto i = pos + 1; i < static_cast<ptrdiff_t>(stacks.size()); ++i) wrappers += "base_layer.";
  return kPeftPrefix + module + "." + wrappers + ab;
}

// Engine output row o of an interleaved gate_up stack <-> Transformers' row: gate i = 2i, up i = 2i + 1.
int64_t peft_out_row(const LoraEntry& e, int64_t o) {
  if (!e.interleaved_out) return o;
  const int64_t I = e.out / 2;
  return o < I ? 2 * o : 2 * (o - I) + 1;
}

Shape peft_shape(const LoraEntry& e, int64_t r, int64_t E) {
  if (e.role != ParamRole::expert_stack) return e.shape;
  return e.is_b ? Shape{e.out, r * E} : Shape{E * r, e.in};
}

Tensor to_peft(const LoraEntry& e, const Tensor& t, int64_t r) {
  if (e.role != ParamRole::expert_stack) return t;
  const int64_t E = t.dim(0);
  if (!e.is_b) return t.clone().view({E * r, e.in});  // [E, r, in] is [E·r, in] expert-major already
  Tensor p = Tensor::empty({e.out, r * E}, DType::F32);
  const float* src = t.data_as<float>();
  float* dst = p.data_as<float>();
  for (int64_t ex = 0; ex < E; ++ex)
    for (int64_t o = 0; o < e.out; ++o)
      for (int64_t j = 0; j < r; ++j) dst[peft_out_row(e, o) * r * E + j * E + ex] = src[(ex * e.out + o) * r + j];
  return p;
}

void from_peft(const LoraEntry& e, const Tensor& p, Tensor& t, int64_t r) {
  const Tensor f = p.dtype() == DType::F32 ? p.clone() : p.to(DType::F32);  // clone: the mapping need not be aligned
  if (e.role != ParamRole::expert_stack || !e.is_b) {
    std::memcpy(t.data(), f.data(), t.nbytes());
    return;
  }
  const int64_t E = t.dim(0);
  const float* src = f.data_as<float>();
  float* dst = t.data_as<float>();
  for (int64_t ex = 0; ex < E; ++ex)
    for (int64_t o = 0; o < e.out; ++o)
      for (int64_t j = 0; j < r; ++j) dst[(ex * e.out + o) * r + j] = src[peft_out_row(e, o) * r * E + j * E + ex];
}

// The base's buffers in the modules trained in full (DeepSeek-V3's and Nemotron-H's router: e_score_correction_bias):
// PEFT saves a modules_to_save copy's whole state dict, persistent buffers included, so its file holds them beside
// the router weight. Table order.
std::vector<const ParamEntry*> full_module_buffers(const LoraTable& t, const ModelWeights& base) {
  std::vector<const ParamEntry*> out;
  for (const ParamEntry& e : base.param_table().entries()) {
    if (e.role != ParamRole::buffer) continue;
    const std::string module = e.name.substr(0, e.name.rfind('.'));
    for (const std::string& full : t.full)
      if (module_of(full) == module) {
        out.push_back(&e);
        break;
      }
  }
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("{}: cannot open", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> lora_to_peft(const LoraWeights& lora, const ModelWeights& base) {
  MT_CHECK(lora.table != nullptr, "lora_to_peft without a table");
  const LoraTable& t = *lora.table;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const LoraEntry& e : t.entries) out.emplace_back(peft_name(t, e), to_peft(e, lora.slot(e), t.config.r));
  for (const std::string& name : t.full) {
    const ParamEntry* pe = base.param_table().find(name);
    MT_CHECK(pe != nullptr, "lora_to_peft: {} is not a base parameter", name);
    out.emplace_back(kPeftPrefix + name, base.slot(*pe));
  }
  for (const ParamEntry* e : full_module_buffers(t, base)) out.emplace_back(kPeftPrefix + e->name, base.slot(*e));
  return out;
}

nlohmann::json lora_peft_config(const DecoderSpec& spec, const LoraTable& table, const std::string& base_model) {
  const std::vector<LoraTargetDef> defs = lora_targets_of(spec);
  const std::vector<PeftSpelling> spellings = peft_spellings(spec, defs);
  nlohmann::json modules = nlohmann::json::array(), parameters = nlohmann::json::array(),
                 to_save = nlohmann::json::array();
  // In the family's order, whatever the recipe's: a resumed run (whose targets come from the saved config) writes
  // the same bytes.
  const std::vector<std::string>& targets = table.config.target;
  for (const PeftSpelling& sp : spellings) {
    if (std::find(targets.begin(), targets.end(), sp.def->name) == targets.end()) continue;
    for (const auto& m : sp.modules) (sp.def->full ? to_save : modules).push_back(m);
    for (const auto& p : sp.parameters) parameters.push_back(p);
  }
  nlohmann::json j;  // keys sorted on dump, as PEFT's json.dumps(sort_keys=True)
  j["alpha_pattern"] = nlohmann::json::object();
  j["base_model_name_or_path"] = base_model;
  j["bias"] = "none";
  j["exclude_modules"] = nullptr;
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["lora_alpha"] = table.config.alpha;
  j["lora_bias"] = false;
  j["lora_dropout"] = 0.0;
  j["modules_to_save"] = to_save.empty() ? nlohmann::json(nullptr) : to_save;
  j["peft_type"] = "LORA";
  j["peft_version"] = "0.19.1";  // the expert layout written is PEFT >= 0.19.1's (docs/peft-format.md)
  j["r"] = table.config.r;
  j["rank_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  j["target_modules"] = modules;  // [] with only expert targets: no fallback to PEFT's default modules
  j["target_parameters"] = parameters.empty() ? nlohmann::json(nullptr) : parameters;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = table.config.use_rslora;
  return j;
}

void lora_write_files(const std::string& dir, const DecoderSpec& spec, const LoraWeights& lora,
                      const ModelWeights& base, const std::string& base_model) {
  const std::string text = lora_peft_config(spec, *lora.table, base_model).dump(2) + "\n";
  file_write_atomic((fs::path(dir) / kConfigFile).string(), {text});
  safetensors_write((fs::path(dir) / kWeightsFile).string(), lora_to_peft(lora, base));
}

void lora_save_pretrained(const std::string& dir, const DecoderSpec& spec, const LoraWeights& lora,
                          const ModelWeights& base, const std::string& base_model) {
  AtomicDirWriter out(dir);
  lora_write_files(out.path(), spec, lora, base, base_model);
  out.commit();
}

bool lora_dir_is_adapter(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / kConfigFile); }

LoraConfig lora_config_read(const std::string& dir, const DecoderSpec& spec) {
  const std::string where = (fs::path(dir) / kConfigFile).string();
  if (!fs::is_regular_file(where)) fail("{}: no adapter_config.json (not a PEFT adapter directory)", dir);
  const nlohmann::ordered_json j = json_parse_strict(read_text(where), where);
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  auto get = [&](const char* k) { return j.contains(k) ? j[k] : nlohmann::ordered_json(); };
  auto refuse_unless = [&](const char* k, const nlohmann::ordered_json& ok, const char* why) {
    const auto v = get(k);
    if (!v.is_null() && v != ok) fail("{}: {}: {} is not supported ({})", where, k, v.dump(), why);
  };
  if (get("peft_type") != "LORA") fail("{}: peft_type: expected \"LORA\", found {}", where, get("peft_type").dump());
  refuse_unless("use_dora", false, "DoRA is not implemented");
  refuse_unless("lora_bias", false, "a bias on lora_B is not implemented");
  refuse_unless("bias", "none", "adapters that train biases are not implemented");
  refuse_unless("fan_in_fan_out", false, "Conv1D-style weights are not used by these models");
  refuse_unless("layers_to_transform", nullptr, "a layer selection is not implemented");
  refuse_unless("alpha_pattern", nlohmann::ordered_json::object(), "per-target alpha is not implemented");
  refuse_unless("rank_pattern", nlohmann::ordered_json::object(), "per-target rank is not implemented");
  refuse_unless("exclude_modules", nullptr, "excluded modules are not implemented");
  refuse_unless("layer_replication", nullptr, "layer replication is not implemented");
  refuse_unless("trainable_token_indices", nullptr, "trainable tokens are not implemented");
  // lora_dropout is read past: it changes training only (score, generate and merge are right whatever it is; a run
  // continuing such an adapter trains it without dropout, docs/lora.md).
  LoraConfig c;
  const auto r = get("r"), alpha = get("lora_alpha");
  if (!r.is_number_integer() || r.get<int64_t>() < 1) fail("{}: r: expected an integer >= 1, found {}", where, r.dump());
  if (!alpha.is_number() || !(alpha.get<double>() > 0))
    fail("{}: lora_alpha: expected a number > 0, found {}", where, alpha.dump());
  c.r = r.get<int64_t>();
  c.alpha = alpha.get<double>();
  if (const auto rs = get("use_rslora"); rs.is_boolean()) c.use_rslora = rs.get<bool>();

  // The config's module and parameter names, then the family's targets that spell exactly those.
  auto names_of = [&](const char* k) {
    std::set<std::string> s;
    const auto v = get(k);
    if (v.is_null()) return s;
    if (!v.is_array()) fail("{}: {}: expected a list of names, found {}", where, k, v.dump());
    for (const auto& n : v) {
      if (!n.is_string()) fail("{}: {}: expected names, found {}", where, k, n.dump());
      s.insert(n.get<std::string>());
    }
    return s;
  };
  std::set<std::string> modules = names_of("target_modules"), parameters = names_of("target_parameters"),
                        to_save = names_of("modules_to_save");
  const std::vector<LoraTargetDef> defs = lora_targets_of(spec);
  for (const PeftSpelling& sp : peft_spellings(spec, defs)) {
    std::set<std::string>& mods = sp.def->full ? to_save : modules;
    if (!sp.def->refused.empty()) {
      for (const auto& m : sp.modules)
        if (mods.count(m)) fail("{}: target_modules: '{}': {}", where, m, sp.def->refused);
      continue;
    }
    bool any = false, all = true;
    for (const auto& m : sp.modules) {
      any = any || mods.count(m) != 0;
      all = all && mods.count(m) != 0;
    }
    for (const auto& p : sp.parameters) {
      // A full path ("model.layers.0.mlp.experts.gate_up_proj") or any dotted suffix of ours matches, as PEFT's
      // key.endswith("." + t) does for every layer.
      const bool has = std::any_of(parameters.begin(), parameters.end(), [&](const std::string& t) {
        return t == p || (t.size() < p.size() && p.compare(p.size() - t.size() - 1, t.size() + 1, "." + t) == 0);
      });
      any = any || has;
      all = all && has;
    }
    if (!any) continue;
    if (!all)
      fail("{}: target '{}' covers {}; mixtune's target adapts all of them, this adapter only some", where,
           sp.def->name, fmt::format("{}", fmt::join(sp.modules.empty() ? sp.parameters : sp.modules, ", ")));
    c.target.push_back(sp.def->name);
    for (const auto& m : sp.modules) mods.erase(m);
    for (const auto& p : sp.parameters)
      for (auto it = parameters.begin(); it != parameters.end();)
        it = (*it == p || (it->size() < p.size() && p.compare(p.size() - it->size() - 1, it->size() + 1, "." + *it) == 0))
                 ? parameters.erase(it)
                 : std::next(it);
  }
  for (const auto* left : {&modules, &parameters, &to_save})
    if (!left->empty())
      fail("{}: {}: '{}' is not a LoRA target mixtune knows for {} models", where,
           left == &modules ? "target_modules" : left == &parameters ? "target_parameters" : "modules_to_save",
           *left->begin(), spec.model_type);
  if (c.target.empty()) fail("{}: target_modules: the adapter targets nothing", where);
  return c;
}

LoraWeights lora_load_pretrained(const std::string& dir, const DecoderSpec& spec, ModelWeights& base) {
  const LoraConfig c = lora_config_read(dir, spec);
  auto table = std::make_shared<const LoraTable>(lora_table_of(spec, c, (fs::path(dir) / kConfigFile).string()));
  LoraWeights w = LoraWeights::zeros(table, spec.num_layers());
  const std::string path = (fs::path(dir) / kWeightsFile).string();
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::set<std::string> used;
  for (const LoraEntry& e : table->entries) {
    const std::string name = peft_name(*table, e);
    if (!f.has(name)) fail("{}: tensor '{}' is missing (adapter of {})", path, name, e.base);
    const SafetensorsInfo& info = f.info(name);
    const Shape want = peft_shape(e, c.r, e.role == ParamRole::expert_stack ? e.shape[0] : 1);
    if ((info.dtype != DType::F32 && info.dtype != DType::BF16) || info.shape != want)
      fail("{}: tensor '{}' is {} {} (expected F32 or BF16 {})", path, name, dtype_safetensors_name(info.dtype),
           shape_str(info.shape), shape_str(want));
    from_peft(e, f.tensor(name), w.slot(e), c.r);
    used.insert(name);
  }
  for (const std::string& pname : table->full) {
    const std::string name = kPeftPrefix + pname;
    const ParamEntry* pe = base.param_table().find(pname);
    MT_CHECK(pe != nullptr, "lora_load_pretrained: {} is not a base parameter", pname);
    if (!f.has(name)) fail("{}: tensor '{}' is missing (modules_to_save)", path, name);
    const SafetensorsInfo& info = f.info(name);
    Tensor& dst = base.slot(*pe);
    if (info.shape != dst.shape() || (info.dtype != DType::F32 && info.dtype != DType::BF16))
      fail("{}: tensor '{}' is {} {} (expected {})", path, name, dtype_safetensors_name(info.dtype),
           shape_str(info.shape), shape_str(dst.shape()));
    dst.copy_from(f.tensor(name).clone());
    used.insert(name);
  }
  // The full-trained modules' buffers, as PEFT writes them; optional (adapters saved before mixtune wrote them lack
  // them, and PEFT loads either). Present, they replace the base's, as PEFT's loaded copy does.
  for (const ParamEntry* e : full_module_buffers(*table, base)) {
    const std::string name = kPeftPrefix + e->name;
    if (!f.has(name)) continue;
    const SafetensorsInfo& info = f.info(name);
    Tensor& held = base.slot(*e);
    if (info.shape != held.shape() || (info.dtype != DType::F32 && info.dtype != DType::BF16))
      fail("{}: tensor '{}' is {} {} (expected F32 or BF16 {}: the module's buffer)", path, name,
           dtype_safetensors_name(info.dtype), shape_str(info.shape), shape_str(held.shape()));
    held.copy_from(f.tensor(name).to(held.dtype()));
    used.insert(name);
  }
  for (const std::string& n : f.names())
    if (!used.count(n)) fail("{}: tensor '{}' is not part of the adapter its config describes", path, n);
  return w;
}

}  // namespace mt
