// GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b; hf-numerics.md §1.2, §4, §7, §8.5): config.json in the hub and
// the Transformers-v5 spellings -> DecoderSpec, the spec back to config.json, the parameter table with
// Transformers' in-memory names, the checkpoint layout and the presets.
//
// Every layer is {attention, moe}: GQA with q/k/v/o biases, a learned sink logit per head, YaRN (or default)
// RoPE and a sliding window on the layers `layer_types` marks; top-k-then-softmax routing with a router bias;
// experts with biases and the clamped SwiGLU; the Switch load-balancing loss over the biased router logits when
// output_router_logits. RMSNorm rounds once (bf16(w · y32)).
#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "models/families/families.h"
#include "models/families/family_params.h"
#include "models/model_weights.h"
#include "models/spec/config_reader.h"
#include "models/spec/config_writer.h"

namespace mt {

namespace {

using nlohmann::json;

constexpr const char* kGptOss = "GptOssForCausalLM";

// v5 `rope_parameters` {rope_type, rope_theta, factor, ...}, or the hub's top-level `rope_theta` + `rope_scaling`
// ({type | rope_type, ...}). GPT-OSS's default is YaRN (factor 32, beta 32/1, no truncation, original 4096) on
// theta 150000. Accepted kinds: yarn and default.
RopeSpec read_rope(const FieldReader& r, int64_t max_positions) {
  RopeSpec rope;
  rope.kind = RopeKind::yarn;
  rope.theta = r.get_number("rope_theta", 150000.0, true);
  rope.factor = 32.0;
  rope.beta_fast = 32.0;
  rope.beta_slow = 1.0;
  rope.truncate = false;
  rope.original_max_position = 4096;
  const json* params = nullptr;
  std::string where;
  for (const char* f : {"rope_parameters", "rope_scaling"})
    if (const json* p = r.find(f); p && !p->is_null()) {
      if (!p->is_object()) r.bad(f, "wrong type", "an object or null", json_found(*p));
      params = p;
      where = f;
      break;  // v5's rope_parameters wins over a legacy rope_scaling
    }
  if (!params) return rope;
  auto field = [&](const char* key) -> const json* {
    auto it = params->find(key);
    return it == params->end() || it->is_null() ? nullptr : &*it;
  };
  auto number = [&](const char* key, double def, bool positive) {
    const json* v = field(key);
    return v ? r.as_number(where + "." + key, *v, positive) : def;
  };
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (const json* t = field(key)) {
      if (!t->is_string()) r.bad(where + "." + key, "wrong type", "a string", json_found(*t));
      type = t->get<std::string>();
      break;
    }
  std::string theta_field = "rope_theta";
  if (field("rope_theta")) theta_field = where + ".rope_theta";
  rope.theta = number("rope_theta", rope.theta, true);
  if (type == "default") {
    rope.kind = RopeKind::standard;
    return rope;
  }
  if (type != "yarn")
    r.bad(where + ".rope_type", "unsupported RoPE type", "one of: yarn, default", json_found(std::string(type)));
  // YaRN's correction range divides by log(theta): a base of 1 or less has no frequencies to interpolate.
  if (rope.theta <= 1)
    r.bad(theta_field, "out of range for YaRN", "a number > 1", fmt::format("{}", rope.theta));
  if (const json* o = field("original_max_position_embeddings"))
    rope.original_max_position = r.as_int(where + ".original_max_position_embeddings", *o, 1, kMaxDim);
  else
    rope.original_max_position = max_positions;
  rope.factor = number("factor", static_cast<double>(max_positions) / static_cast<double>(rope.original_max_position),
                       true);
  rope.beta_fast = number("beta_fast", 32.0, true);
  rope.beta_slow = number("beta_slow", 1.0, true);
  if (const json* t = field("truncate")) {
    if (!t->is_boolean()) r.bad(where + ".truncate", "wrong type", "true or false", json_found(*t));
    rope.truncate = t->get<bool>();
  } else {
    rope.truncate = true;  // Transformers' default when the key is absent
  }
  if (const json* af = field("attention_factor"))
    rope.attention_factor = r.as_number(where + ".attention_factor", *af, true);
  else if (field("mscale") && field("mscale_all_dim"))
    rope.attention_factor = yarn_mscale(rope.factor, number("mscale", 1, true)) /
                            yarn_mscale(rope.factor, number("mscale_all_dim", 1, true));
  else
    rope.attention_factor = yarn_mscale(rope.factor, 1.0);
  return rope;
}

// layer_types: "sliding_attention" | "full_attention" per layer; absent: even layers slide (Transformers'
// default rule), odd layers attend to everything.
std::vector<bool> read_sliding_layers(const FieldReader& r, int64_t num_layers) {
  std::vector<bool> sliding(static_cast<size_t>(num_layers));
  const json* v = r.find("layer_types");
  if (!v || v->is_null()) {
    for (int64_t l = 0; l < num_layers; ++l) sliding[static_cast<size_t>(l)] = (l + 1) % 2 != 0;
    return sliding;
  }
  if (!v->is_array()) r.bad("layer_types", "wrong type", "a list of strings", json_found(*v));
  if (static_cast<int64_t>(v->size()) != num_layers)
    r.bad("layer_types", "one entry per layer", fmt::format("{} entries (num_hidden_layers)", num_layers),
          fmt::format("{} entries", v->size()));
  for (size_t i = 0; i < v->size(); ++i) {
    const json& t = (*v)[i];
    const std::string f = fmt::format("layer_types[{}]", i);
    if (t == "sliding_attention")
      sliding[i] = true;
    else if (t == "full_attention")
      sliding[i] = false;
    else
      r.bad(f, "unknown layer type", "\"sliding_attention\" or \"full_attention\"", json_found(t));
  }
  return sliding;
}

DecoderSpec parse_gpt_oss(const FieldReader& r) {
  DecoderSpec s;
  s.norm_rounding = NormRounding::gpt_oss;
  s.vocab_size = r.get_int("vocab_size", 201088);
  s.hidden_size = r.get_int("hidden_size", 2880);
  const int64_t num_layers = r.get_int("num_hidden_layers", 36, 1, kMaxLayers);
  s.max_position_embeddings = r.get_int("max_position_embeddings", 131072);

  AttentionSpec full;
  full.kind = AttentionKind::gqa;
  full.heads = r.get_int("num_attention_heads", 64);
  // As in Qwen3: null means "as many as the query heads", missing takes the class default (8).
  if (r.present_not_null("num_key_value_heads"))
    full.kv_heads = r.need_int("num_key_value_heads");
  else
    full.kv_heads = r.present("num_key_value_heads") ? full.heads : 8;
  if (full.heads % full.kv_heads != 0)
    r.bad("num_key_value_heads", "num_attention_heads must be a multiple of it",
          fmt::format("a divisor of num_attention_heads = {}", full.heads), std::to_string(full.kv_heads));
  full.head_dim = r.present_not_null("head_dim") ? r.need_int("head_dim") : 64;
  if (full.head_dim % 2 != 0)
    r.bad("head_dim", "RoPE rotates the two halves of a head", "an even number", std::to_string(full.head_dim));
  full.qkv_bias = full.o_bias = r.get_bool("attention_bias", true);
  full.sinks = true;
  full.eager_bf16 = true;
  full.rope = read_rope(r, s.max_position_embeddings);
  if (r.get_number("attention_dropout", 0.0, false) != 0.0)
    r.bad("attention_dropout", "attention dropout is not supported", "0", json_found(*r.find("attention_dropout")));

  MoeSpec m;
  const bool has_ne = r.present("num_experts"), has_nle = r.present("num_local_experts");
  m.num_experts = has_nle ? r.need_int("num_local_experts") : has_ne ? r.need_int("num_experts") : 128;
  if (has_ne && has_nle && r.need_int("num_experts") != m.num_experts)
    r.bad("num_local_experts", "disagrees with num_experts", std::to_string(r.need_int("num_experts")),
          std::to_string(m.num_experts));
  const bool has_k = r.present("num_experts_per_tok"), has_hub_k = r.present("experts_per_token");
  m.experts_per_token = has_k       ? r.need_int("num_experts_per_tok", 1, m.num_experts)
                        : has_hub_k ? r.need_int("experts_per_token", 1, m.num_experts)
                                    : std::min<int64_t>(4, m.num_experts);
  if (has_k && has_hub_k && r.need_int("experts_per_token", 1, m.num_experts) != m.experts_per_token)
    r.bad("experts_per_token", "disagrees with num_experts_per_tok", std::to_string(m.experts_per_token),
          std::to_string(r.need_int("experts_per_token", 1, m.num_experts)));
  m.expert.intermediate_size = r.get_int("intermediate_size", 2880);
  m.expert.activation = Activation::swiglu_oai;
  m.expert.bias = true;
  m.router.score = RouterScore::topk_softmax;
  m.router.linear_bias = true;
  m.aux_loss_on = r.get_bool("output_router_logits", false);
  m.aux_loss_coef = r.get_number("router_aux_loss_coef", 0.001, false);
  // Transformers hard-codes the clamp (7.0) and α (1.702) and ignores `swiglu_limit`; a checkpoint that asks for
  // another limit would not get it there either, so refuse rather than silently differ.
  if (r.present_not_null("swiglu_limit") && r.get_number("swiglu_limit", 7.0, true) != 7.0)
    r.bad("swiglu_limit", "Transformers runs GPT-OSS with the limit 7.0 whatever the config says", "7.0",
          json_found(*r.find("swiglu_limit")));

  s.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  s.padding_idx = read_padding_idx(r, s.vocab_size);  // GptOssModel: nn.Embedding(V, H, pad_token_id)
  s.norm_eps = r.get_number("rms_norm_eps", 1e-5, true);
  s.initializer_range = r.get_number("initializer_range", 0.02, false);
  s.dtype = read_dtype(r);

  check_tensor_size(r, "vocab_size", "embed_tokens", {s.vocab_size, s.hidden_size});
  check_tensor_size(r, "num_attention_heads", "q_proj", {full.heads, full.head_dim, s.hidden_size});
  check_tensor_size(r, "num_local_experts", "mlp.experts.gate_up_proj",
                    {m.num_experts, 2, m.expert.intermediate_size, s.hidden_size});

  // Two attention configurations: full, and the same with the window on the layers that slide.
  const std::vector<bool> sliding = read_sliding_layers(r, num_layers);
  AttentionSpec window = full;
  window.sliding_window = r.get_int("sliding_window", 128);
  s.attention = {full, window};
  s.moe = {m};
  for (int64_t l = 0; l < num_layers; ++l)
    s.layers.push_back({{{SublayerKind::attention, sliding[static_cast<size_t>(l)] ? 1 : 0}, {SublayerKind::moe, 0}}});
  return s;
}

// The spec's sliding window (0 when no layer slides).
int64_t window_of(const DecoderSpec& s) {
  for (const AttentionSpec& a : s.attention)
    if (a.sliding_window > 0) return a.sliding_window;
  return 0;
}

json to_json(const DecoderSpec& s) {
  const AttentionSpec& a = s.attention.at(0);
  const MoeSpec& m = s.moe.at(0);
  json j = config_json_common(s, a);
  j["intermediate_size"] = m.expert.intermediate_size;
  // v5 canonical spellings of the expert count and top-k.
  j.erase("num_experts");
  j.erase("experts_per_token");
  j["num_local_experts"] = m.num_experts;
  j["num_experts_per_tok"] = m.experts_per_token;
  j["output_router_logits"] = m.aux_loss_on;
  j["router_aux_loss_coef"] = m.aux_loss_coef;
  if (const int64_t w = window_of(s); w > 0) j["sliding_window"] = w;
  json types = json::array();
  for (int64_t l = 0; l < s.num_layers(); ++l)
    types.push_back(s.attention_of(l)->sliding_window > 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  // v5 folds rope_theta / rope_scaling into rope_parameters; keep any extra keys it had.
  json rope = config_json_rope_base(j, /*from_legacy=*/true);
  rope["rope_theta"] = a.rope.theta;
  if (a.rope.kind == RopeKind::yarn) {
    rope["rope_type"] = "yarn";
    rope["factor"] = a.rope.factor;
    rope["beta_fast"] = a.rope.beta_fast;
    rope["beta_slow"] = a.rope.beta_slow;
    rope["original_max_position_embeddings"] = a.rope.original_max_position;
    rope["truncate"] = a.rope.truncate;
  } else {
    rope["rope_type"] = "default";
  }
  config_json_finish(j, s, rope);
  return j;
}

// Transformers' named_parameters() order: a module's own parameters before its children's, so a layer is
// self_attn.sinks, self_attn.{q,k,v,o}_proj.{weight,bias}, mlp.router.{weight,bias},
// mlp.experts.{gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias}, input_layernorm,
// post_attention_layernorm (the shard map of a Transformers-saved checkpoint shows it: sinks share the first shard
// with q/k/v, o_proj starts the next).
ParamTable param_table(const DecoderSpec& s) {
  const int64_t H = s.hidden_size, V = s.vocab_size;
  ParamTable t;
  t.num_experts = s.num_experts();
  t.experts_per_token = s.experts_per_token();
  t.tied_embeddings = s.tie_word_embeddings;
  using U = ParamUse;
  using W = WeightSlot;
  auto add = [&](std::string name, Shape shape, ParamUse use, int64_t layer, int slot,
                 ParamRole role = ParamRole::replicated, std::optional<ParamInit> init = std::nullopt) {
    add_param(t, std::move(name), std::move(shape), use, layer, slot, role, init);
  };
  add("model.embed_tokens.weight", {V, H}, U::embedding, -1, W::embed);
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    if (const AttentionSpec* a = s.attention_of(l)) {
      if (a->sinks) add(p + "self_attn.sinks", {a->heads}, U::sink, l, W::sinks);
      add_attention_projections(t, p + "self_attn.", *a, H, l);
    }
    if (const MoeSpec* m = s.moe_of(l)) {
      const int64_t E = m->num_experts, I = m->expert.intermediate_size;
      add(p + "mlp.router.weight", {E, H}, U::router, l, W::router);
      // Transformers initialises the router's bias like its weight, normal(0, initializer_range).
      if (m->router.linear_bias)
        add(p + "mlp.router.bias", {E}, U::bias, l, W::router_bias, ParamRole::replicated, ParamInit::normal);
      // In the engines' layout (the checkpoint's [E, H, 2I] interleaved, transposed by the layout's rules):
      // gate_up rows 0..I-1 = gate, I..2I-1 = up.
      const auto X = ParamRole::expert_stack;
      add(p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, U::linear, l, W::experts_gate_up, X);
      if (m->expert.bias) add(p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}, U::bias, l, W::experts_gate_up_bias, X);
      add(p + "mlp.experts.down_proj", {E, H, I}, U::linear, l, W::experts_down, X);
      if (m->expert.bias) add(p + "mlp.experts.down_proj_bias", {E, H}, U::bias, l, W::experts_down_bias, X);
    }
    add(p + "input_layernorm.weight", {H}, U::norm, l, W::input_norm);
    add(p + "post_attention_layernorm.weight", {H}, U::norm, l, W::post_norm);
  }
  add("model.norm.weight", {H}, U::norm, -1, W::final_norm);
  if (!s.tie_word_embeddings) add("lm_head.weight", {V, H}, U::lm_head, -1, W::lm_head);
  return t;
}

HfLayout hf_layout(const DecoderSpec&) { return gpt_oss_hf_layout(); }

json gpt_oss_base() {
  return {
      {"architectures", {kGptOss}},
      {"model_type", "gpt_oss"},
      {"hidden_act", "silu"},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"output_router_logits", false},
      {"router_aux_loss_coef", 0.9},
      {"rms_norm_eps", 1e-5},
      {"initializer_range", 0.02},
      {"vocab_size", 201088},
      {"hidden_size", 2880},
      {"intermediate_size", 2880},
      {"head_dim", 64},
      {"num_attention_heads", 64},
      {"num_key_value_heads", 8},
      {"num_experts_per_tok", 4},
      {"experts_per_token", 4},
      {"sliding_window", 128},
      {"swiglu_limit", 7.0},
      {"max_position_embeddings", 131072},
      {"rope_scaling",
       {{"rope_type", "yarn"},
        {"factor", 32.0},
        {"beta_fast", 32.0},
        {"beta_slow", 1.0},
        {"truncate", false},
        {"original_max_position_embeddings", 4096}}},
      {"rope_theta", 150000},
      {"tie_word_embeddings", false},
      {"eos_token_id", 200002},
      {"pad_token_id", 199999},
      {"dtype", "bfloat16"},
  };
}

// The hub's config of a size: its layer count and expert count, every layer type listed as the hub does.
json gpt_oss_preset(int64_t layers, int64_t experts) {
  json j = gpt_oss_base();
  j["num_hidden_layers"] = layers;
  j["num_local_experts"] = experts;
  json types = json::array();
  for (int64_t l = 0; l < layers; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  return j;
}

}  // namespace

// hf-numerics.md §4.3, §8.5: Transformers keeps GPT-OSS's fused experts under their own names and layout,
// gate_up_proj [E, H, 2I] with gate/up interleaved in the last dim (gate = [..., ::2]) and down_proj [E, I, H], both
// used as x·W; the hub ships them MXFP4 (`_blocks` + `_scales`, dequantised on load, §8.5). The engines hold
// [E, 2I, H] (gate rows, then up rows) and [E, H, I], as for every family: transposed and de-interleaved on load,
// re-interleaved on save. Saved in state_dict order (Transformers converts nothing for gpt_oss).
HfLayout gpt_oss_hf_layout() {
  HfLayout l;
  const std::string x = "model.layers.{L}.mlp.experts.";
  l.rules = {
      hf_param(x + "gate_up_proj", hf_deinterleave(1, hf_transpose(hf_tensor(x + "gate_up_proj", hf_mxfp4)))),
      hf_param(x + "gate_up_proj_bias", hf_deinterleave(1, hf_tensor(x + "gate_up_proj_bias"))),
      hf_param(x + "down_proj", hf_transpose(hf_tensor(x + "down_proj", hf_mxfp4))),
  };
  l.save_order = HfSaveOrder::state_dict;
  return l;
}

namespace {
// PEFT's module names: the attention projections (their biases stay frozen), the routed experts' two fused stacks
// (PEFT's target_parameters; the expert biases stay frozen), and the router (weight and bias) trained in full.
std::vector<LoraTargetDef> lora_targets(const DecoderSpec&) {
  using W = WeightSlot;
  return {{"q_proj", {W::q_proj}},
          {"k_proj", {W::k_proj}},
          {"v_proj", {W::v_proj}},
          {"o_proj", {W::o_proj}},
          {"experts", {W::experts_gate_up, W::experts_down}, false, /*interleaved_gate_up=*/true},
          {"router", {W::router, W::router_bias}, true}};
}
}  // namespace

std::vector<ArchitectureInfo> gpt_oss_architectures() {
  return {{kGptOss, "gpt_oss",
           "GPT-OSS decoder (GQA with biases, sinks and alternating sliding windows, YaRN; top-k routed clamped-SwiGLU "
           "experts with biases)",
           &parse_gpt_oss, &to_json, &param_table, &hf_layout, &lora_targets}};
}

std::vector<PresetInfo> gpt_oss_presets() {
  return {
      {"gpt-oss-20b", "gpt-oss-20b shapes: 24 layers, hidden 2880, 32 experts top-4, vocab 201088",
       [] { return gpt_oss_preset(24, 32); }},
      {"gpt-oss-120b", "gpt-oss-120b shapes: 36 layers, hidden 2880, 128 experts top-4, vocab 201088",
       [] { return gpt_oss_preset(36, 128); }},
  };
}

}  // namespace mt
