#include "models/spec/decoder_spec.h"

#include <cmath>

#include "core/error.h"
#include "models/registry.h"
#include "models/spec/config_reader.h"

namespace mt {

double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

namespace {

const Sublayer* find_sublayer(const DecoderSpec& s, int64_t layer, SublayerKind kind) {
  MT_CHECK(layer >= 0 && layer < s.num_layers(), "layer {} of a model with {} layers", layer, s.num_layers());
  for (const Sublayer& sub : s.layers[static_cast<size_t>(layer)].sublayers)
    if (sub.kind == kind) return &sub;
  return nullptr;
}

template <typename T>
const T* spec_at(const std::vector<T>& v, const Sublayer* sub) {
  return sub ? &v.at(static_cast<size_t>(sub->index)) : nullptr;
}

}  // namespace

const AttentionSpec* DecoderSpec::attention_of(int64_t layer) const {
  return spec_at(attention, find_sublayer(*this, layer, SublayerKind::attention));
}
const MlpSpec* DecoderSpec::mlp_of(int64_t layer) const {
  return spec_at(mlp, find_sublayer(*this, layer, SublayerKind::mlp));
}
const MoeSpec* DecoderSpec::moe_of(int64_t layer) const {
  return spec_at(moe, find_sublayer(*this, layer, SublayerKind::moe));
}
const Mamba2Spec* DecoderSpec::mamba2_of(int64_t layer) const {
  return spec_at(mamba2, find_sublayer(*this, layer, SublayerKind::mamba2));
}

bool DecoderSpec::has_moe() const {
  for (int64_t l = 0; l < num_layers(); ++l)
    if (is_moe_layer(l)) return true;
  return false;
}

int64_t DecoderSpec::num_experts() const { return moe.empty() ? 0 : moe[0].num_experts; }
int64_t DecoderSpec::experts_per_token() const { return moe.empty() ? 0 : moe[0].experts_per_token; }

const AttentionSpec& DecoderSpec::only_attention() const {
  if (attention.size() != 1)
    fail("{}: {} attention configurations; this path runs models whose layers share one", architecture,
         attention.size());
  return attention[0];
}

const MoeSpec& DecoderSpec::only_moe() const {
  if (moe.size() != 1)
    fail("{}: {} MoE configurations; this path runs models whose MoE layers share one", architecture, moe.size());
  return moe[0];
}

const MlpSpec& DecoderSpec::only_mlp() const {
  if (mlp.size() != 1)
    fail("{}: {} dense MLP configurations; this path runs models whose MLP layers share one", architecture,
         mlp.size());
  return mlp[0];
}

bool DecoderSpec::aux_loss_on() const {
  for (int64_t l = 0; l < num_layers(); ++l)
    if (const MoeSpec* m = moe_of(l); m && m->aux_loss_on) return true;
  return false;
}

double DecoderSpec::aux_loss_coef() const {
  for (int64_t l = 0; l < num_layers(); ++l)
    if (const MoeSpec* m = moe_of(l); m && m->aux_loss_on) return m->aux_loss_coef;
  return 0.0;
}

void spec_check(const DecoderSpec& s, const std::string& file) {
  auto in_range = [&](const Sublayer& sub, size_t n, int64_t l) {
    if (sub.index < 0 || static_cast<size_t>(sub.index) >= n)
      fail("{}: layer {}: {} sublayer refers to configuration {} of {}", file, l, sublayer_kind_name(sub.kind),
           sub.index, n);
  };
  for (int64_t l = 0; l < s.num_layers(); ++l)
    for (const Sublayer& sub : s.layers[static_cast<size_t>(l)].sublayers) switch (sub.kind) {
        case SublayerKind::attention: in_range(sub, s.attention.size(), l); break;
        case SublayerKind::mlp: in_range(sub, s.mlp.size(), l); break;
        case SublayerKind::moe: in_range(sub, s.moe.size(), l); break;
        case SublayerKind::mamba2: in_range(sub, s.mamba2.size(), l); break;
      }
  if (s.padding_idx && (*s.padding_idx < 0 || *s.padding_idx >= s.vocab_size))
    fail("{}: padding index {} is outside the vocabulary [0, {})", file, *s.padding_idx, s.vocab_size);
  for (const MoeSpec& m : s.moe)
    if (m.num_experts != s.moe[0].num_experts || m.experts_per_token != s.moe[0].experts_per_token)
      fail("{}: MoE layers with different expert counts ({} top-{} and {} top-{}) are not supported", file,
           s.moe[0].num_experts, s.moe[0].experts_per_token, m.num_experts, m.experts_per_token);
}

const char* sublayer_kind_name(SublayerKind k) {
  switch (k) {
    case SublayerKind::attention: return "attention";
    case SublayerKind::mlp: return "mlp";
    case SublayerKind::moe: return "moe";
    case SublayerKind::mamba2: return "mamba2";
  }
  return "unknown";
}

DecoderSpec DecoderSpec::from_json(const nlohmann::json& j, const std::string& file) {
  if (!j.is_object()) fail("{}: field '(root)': wrong type (expected a JSON object, found {})", file, json_found(j));
  FieldReader r{j, file};
  // architectures[0] picks the model class, as AutoModelForCausalLM does.
  const nlohmann::json* archs = r.find("architectures");
  if (!archs) r.missing("architectures", "a non-empty list of strings");
  if (!archs->is_array() || archs->empty())
    r.bad("architectures", "wrong type", "a non-empty list of strings", json_found(*archs));
  if (!(*archs)[0].is_string()) r.bad("architectures[0]", "wrong type", "a string", json_found((*archs)[0]));
  const ArchitectureInfo& arch = architecture_lookup((*archs)[0].get<std::string>(), file);
  if (r.present("model_type")) {
    std::string mt = r.get_string("model_type", "");
    if (mt != arch.model_type)
      r.bad("model_type", fmt::format("does not match architecture {}", arch.name),
            fmt::format("\"{}\"", arch.model_type), json_found(*r.find("model_type")));
  }
  DecoderSpec s = arch.parse(r);
  s.quant = read_checkpoint_quant(r);
  if (s.quant.method == CheckpointQuant::Method::mxfp4 && !hf_layout_accepts(arch.hf_layout(s), hf_mxfp4))
    r.bad("quantization_config.quant_method", fmt::format("{} has no tensors stored as MXFP4", arch.name),
          "\"fp8\" or no quantization_config", "\"mxfp4\"");
  s.architecture = arch.name;
  s.model_type = arch.model_type;
  s.raw = j;
  spec_check(s, file);
  return s;
}

DecoderSpec DecoderSpec::from_file(const std::string& path) { return from_json(read_config_file(path), path); }

nlohmann::json DecoderSpec::to_json() const {
  nlohmann::json j = architecture_lookup(architecture, "config").to_json(*this);
  j.erase("quantization_config");  // the weights were dequantised on load; they are saved as floats
  return j;
}

}  // namespace mt
