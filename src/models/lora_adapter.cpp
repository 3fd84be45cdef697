#include "models/lora_adapter.h"

#include <cmath>
#include <set>

#include "core/error.h"
#include "core/float_convert.h"
#include "kernels/cpu/cpu_tensor.h"
#include "core/rng.h"
#include "models/registry.h"

namespace mt {

double LoraConfig::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

const LoraEntry* LoraTable::find(const std::string& name) const {
  for (const LoraEntry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

namespace {

std::string module_of(const std::string& param) {
  const std::string w = ".weight";
  return param.size() > w.size() && param.compare(param.size() - w.size(), w.size(), w) == 0
             ? param.substr(0, param.size() - w.size())
             : param;
}

std::string known_names(const std::vector<LoraTargetDef>& defs) {
  std::string s;
  for (const LoraTargetDef& d : defs)
    if (d.refused.empty()) s += (s.empty() ? "" : ", ") + d.name;
  return s;
}

bool covers(const LoraTargetDef& d, const ParamEntry& e) {
  if (e.layer < 0) return false;
  for (int s : d.slots)
    if (s == e.slot) return true;
  return false;
}

}  // namespace

LoraTable lora_table_of(const DecoderSpec& spec, const LoraConfig& c, const std::string& source) {
  if (c.r <= 0) fail("{}: peft.r: must be an integer >= 1 (found {})", source, c.r);
  if (!(c.alpha > 0) || !std::isfinite(c.alpha)) fail("{}: peft.alpha: must be a number > 0 (found {})", source, c.alpha);
  if (c.target.empty()) fail("{}: peft.target: must list at least one target", source);
  const std::vector<LoraTargetDef> defs = lora_targets_of(spec);
  const ParamTable base = param_table_of(spec);
  std::vector<const LoraTargetDef*> chosen;
  std::set<std::string> seen;
  for (const std::string& name : c.target) {
    const LoraTargetDef* def = nullptr;
    for (const LoraTargetDef& d : defs)
      if (d.name == name) def = &d;
    if (!def)
      fail("{}: peft.target: '{}' is not a LoRA target of {} models (known: {})", source, name, spec.model_type,
           known_names(defs));
    if (!def->refused.empty()) fail("{}: peft.target: '{}': {}", source, name, def->refused);
    if (!seen.insert(name).second) fail("{}: peft.target: '{}' is listed twice", source, name);
    int64_t matches = 0;
    for (const ParamEntry& e : base.entries()) matches += covers(*def, e);
    if (matches == 0)
      fail("{}: peft.target: '{}' matches no parameter of this model (no layer has that sublayer)", source, name);
    chosen.push_back(def);
  }
  LoraTable t;
  t.config = c;
  t.num_experts = base.num_experts;
  for (const ParamEntry& e : base.entries()) {
    const LoraTargetDef* def = nullptr;
    for (const LoraTargetDef* d : chosen)
      if (covers(*d, e)) def = d;
    if (!def) continue;
    if (def->full) {
      t.full.push_back(e.name);
      continue;
    }
    const bool stack = e.role == ParamRole::expert_stack;
    MT_CHECK(e.shape.size() == (stack ? 3u : 2u), "LoRA target {} has shape {}", e.name, shape_str(e.shape));
    const int64_t out = e.shape[stack ? 1 : 0], in = e.shape[stack ? 2 : 1];
    const std::string module = module_of(e.name);
    for (bool is_b : {false, true}) {
      LoraEntry a;
      a.name = module + (is_b ? ".lora_B.weight" : ".lora_A.weight");
      a.base = e.name;
      a.target = def->name;
      a.shape = is_b ? Shape{out, c.r} : Shape{c.r, in};
      if (stack) a.shape.insert(a.shape.begin(), e.shape[0]);
      a.role = e.role;
      a.layer = e.layer;
      a.slot = e.slot;
      a.is_b = is_b;
      a.in = in;
      a.out = out;
      a.interleaved_out = def->interleaved_gate_up && e.slot == WeightSlot::experts_gate_up;
      a.peft_parameter = stack || def->peft_as_parameter;
      t.entries.push_back(std::move(a));
    }
  }
  return t;
}

int64_t lora_parameter_count(const LoraTable& t) {
  int64_t n = 0;
  for (const LoraEntry& e : t.entries) n += shape_numel(e.shape);
  return n;
}

LoraPair* LayerLora::at(int slot) {
  using W = WeightSlot;
  switch (slot) {
    case W::q_proj: return &q_proj;
    case W::k_proj: return &k_proj;
    case W::v_proj: return &v_proj;
    case W::o_proj: return &o_proj;
    case W::mlp_gate: return &mlp_gate;
    case W::mlp_up: return &mlp_up;
    case W::mlp_down: return &mlp_down;
    case W::experts_gate_up: return &experts_gate_up;
    case W::experts_down: return &experts_down;
    case W::q_a_proj: return &q_a_proj;
    case W::q_b_proj: return &q_b_proj;
    case W::kv_a_proj: return &kv_a_proj;
    case W::kv_b_proj: return &kv_b_proj;
    case W::shared_gate: return &shared_gate;
    case W::shared_up: return &shared_up;
    case W::shared_down: return &shared_down;
    case W::mamba_in_proj: return &mamba_in_proj;
    case W::mamba_out_proj: return &mamba_out_proj;
    default: return nullptr;
  }
}

const LoraPair* LayerLora::at(int slot) const { return const_cast<LayerLora*>(this)->at(slot); }

cpu::LoraRef LayerLora::ref(int slot) const {
  const LoraPair* p = at(slot);
  if (!p || !p->on()) return {};
  return {&p->a, &p->b, scale};
}

cpu::LoraGradRef LayerLora::grad(int slot) {
  LoraPair* p = at(slot);
  if (!p || !p->on()) return {};
  return {&p->a, &p->b};
}

Tensor& LoraWeights::slot(const LoraEntry& e) {
  MT_CHECK(e.layer >= 0 && e.layer < static_cast<int64_t>(layers.size()), "LoRA entry {} at layer {} of {}", e.name,
           e.layer, layers.size());
  LoraPair* p = layers[static_cast<size_t>(e.layer)].at(e.slot);
  MT_CHECK(p != nullptr, "LoRA entry {}: slot {} takes no adapter", e.name, e.slot);
  return e.is_b ? p->b : p->a;
}

const Tensor& LoraWeights::slot(const LoraEntry& e) const { return const_cast<LoraWeights*>(this)->slot(e); }

std::vector<std::pair<std::string, Tensor*>> LoraWeights::named_parameters() {
  std::vector<std::pair<std::string, Tensor*>> r;
  if (table)
    for (const LoraEntry& e : table->entries) r.emplace_back(e.name, &slot(e));
  return r;
}

std::vector<std::pair<std::string, const Tensor*>> LoraWeights::named_parameters() const {
  std::vector<std::pair<std::string, const Tensor*>> r;
  if (table)
    for (const LoraEntry& e : table->entries) r.emplace_back(e.name, &slot(e));
  return r;
}

LoraWeights LoraWeights::zeros(std::shared_ptr<const LoraTable> table, int64_t num_layers) {
  MT_CHECK(table != nullptr, "LoraWeights::zeros without a table");
  LoraWeights w;
  w.layers.resize(static_cast<size_t>(num_layers));
  const auto scale = static_cast<float>(table->config.scaling());
  for (LayerLora& l : w.layers) l.scale = scale;
  w.table = std::move(table);
  for (const LoraEntry& e : w.table->entries) w.slot(e) = Tensor::zeros(e.shape, DType::F32);
  return w;
}

LoraWeights LoraWeights::init(std::shared_ptr<const LoraTable> table, int64_t num_layers, uint64_t seed) {
  LoraWeights w = zeros(std::move(table), num_layers);
  for (const LoraEntry& e : w.table->entries) {
    if (e.is_b) continue;
    const double bound = 1.0 / std::sqrt(static_cast<double>(e.in));
    Tensor& t = w.slot(e);
    Rng rng(seed, rng_stream_of(e.name));
    rng.fill_uniform(t.data_as<float>(), t.numel(), -bound, bound);
  }
  return w;
}

void lora_merge_into(ModelWeights& base, const LoraWeights& lora) {
  MT_CHECK(lora.table != nullptr, "lora_merge_into without an adapter table");
  const ParamTable& table = base.param_table();
  const std::vector<LoraEntry>& es = lora.table->entries;
  for (size_t i = 0; i + 1 < es.size(); i += 2) {
    const LoraEntry& ea = es[i];
    const LoraEntry& eb = es[i + 1];
    MT_CHECK(!ea.is_b && eb.is_b && ea.base == eb.base, "LoRA table: {} is not followed by its B", ea.name);
    const ParamEntry* pe = table.find(ea.base);
    if (!pe) fail("merge: the base model has no parameter {} (adapted by {})", ea.base, ea.name);
    Tensor& w = base.slot(*pe);
    const Shape want = pe->shape;
    if (w.shape() != want)
      fail("merge: base parameter {} has shape {}, the adapter needs {}", ea.base, shape_str(w.shape()),
           shape_str(want));
    const Tensor& a = lora.slot(ea);
    const Tensor& b = lora.slot(eb);
    const int64_t experts = ea.role == ParamRole::expert_stack ? want[0] : 1;
    const int64_t in = ea.in, out = ea.out, r = lora.table->config.r;
    const float s = static_cast<float>(lora.table->config.scaling());
    std::vector<float> d(static_cast<size_t>(out * in));
    for (int64_t e = 0; e < experts; ++e) {
      cpu::gemm_nn(out, in, r, 1.0f, b.data_as<float>() + e * out * r, r, a.data_as<float>() + e * r * in, in, 0.0f,
                   d.data(), in);
      const int64_t at = e * out * in;
      if (w.dtype() == DType::F32) {
        float* wp = w.data_as<float>() + at;
        for (int64_t k = 0; k < out * in; ++k) wp[k] = wp[k] + d[static_cast<size_t>(k)] * s;
      } else {
        MT_CHECK(w.dtype() == DType::BF16, "merge: {} has dtype {}", ea.base, dtype_safetensors_name(w.dtype()));
        // nn.Linear: W.data += Δ (fp32 Δ, one rounding). A parameter target (PEFT's ParamWrapper: expert stacks,
        // Qwen3-MoE's dense MLP weights): Δ is cast to W's dtype first, then added: two roundings.
        const bool delta_rounded = ea.peft_parameter;
        auto* wp = w.data_as<uint16_t>() + at;
        for (int64_t k = 0; k < out * in; ++k) {
          const float delta = d[static_cast<size_t>(k)] * s;
          wp[k] = float_to_bf16(bf16_to_float(wp[k]) + (delta_rounded ? round_bf16(delta) : delta));
        }
      }
    }
  }
}

ModelWeights lora_base_grads(const DecoderSpec& spec, const LoraTable& table) {
  ModelWeights g;
  g.table = std::make_shared<const ParamTable>(param_table_of(spec));
  g.layers.resize(static_cast<size_t>(spec.num_layers()));
  for (const std::string& name : table.full) {
    const ParamEntry* e = g.table->find(name);
    MT_CHECK(e != nullptr, "LoRA: full-trained parameter {} is not in the table", name);
    g.slot(*e) = Tensor::zeros(e->shape, DType::F32);
  }
  return g;
}

}  // namespace mt
