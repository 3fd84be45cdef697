// DeepseekV3ForCausalLM (DeepSeek-V3 / R1, Moonlight-16B-A3B; hf-numerics.md §1.2, §5, §7, §8.1, §8.6):
// config.json in the hub and the Transformers-v5 spellings -> DecoderSpec, the spec back to config.json, the
// parameter table with Transformers' in-memory names, the checkpoint layout and the presets.
//
// Every layer is {attention, mlp | moe}: multi-head latent attention (an optional low-rank query, a joint key/value
// latent, RoPE on qk_rope_head_dim dims only, interleaved by default; softmax scale qk_head_dim^-1/2 · mscale² under
// YaRN), then a SwiGLU MLP on the first first_k_dense_replace layers and, after them, sigmoid group-limited top-k
// routed SwiGLU experts with a shared expert beside them. No load-balancing loss (Transformers computes none); the
// fp32 e_score_correction_bias is a buffer Transformers never updates. RMSNorm rounds as Qwen's.
//
// Quirks of Transformers 5.17 followed here: config `head_dim` is overwritten with qk_rope_head_dim (and saved so);
// q_lora_rank null means a plain q_proj; the latent norms keep the class default eps 1e-6 whatever rms_norm_eps says;
// scoring_func, topk_method, moe_layer_freq are not read (hard-coded sigmoid / noaux_tc / every layer from
// first_k_dense_replace on), so a config asking for something else is refused rather than run differently; MTP
// layers (num_nextn_predict_layers, stored as layers num_hidden_layers.., and layer 61 by name) are dropped on load.
#include <cmath>
#include <optional>
#include <string>

#include "core/error.h"
#include "models/families/families.h"
#include "models/families/family_params.h"
#include "models/model_weights.h"
#include "models/spec/config_reader.h"
#include "models/spec/config_writer.h"

namespace mt {

namespace {

using nlohmann::json;

constexpr const char* kDeepseekV3 = "DeepseekV3ForCausalLM";

// Transformers' get_mscale / yarn_get_mscale (modeling_rope_utils.py, modeling_deepseek_v3.py).
double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// The RoPE of the rope dims and the softmax scale it implies.
struct DsRope {
  RopeSpec rope;
  double scale_factor = 1.0;  // multiplies qk_head_dim^-1/2 (yarn_apply_mscale: mscale(factor, mscale_all_dim)²)
};

// v5 `rope_parameters` {rope_type, rope_theta, factor, mscale, mscale_all_dim, ...}, or the hub's top-level
// `rope_theta` + `rope_scaling` ({type | rope_type, ...}). As convert_rope_params_to_dict: a non-empty rope_scaling
// wins over rope_parameters, a theta inside the object over the top-level one. Kinds: default and yarn. The YaRN
// frequencies span head_dim = qk_rope_head_dim dims (`rope_dim`).
DsRope read_rope(const FieldReader& r, int64_t max_positions) {
  DsRope out;
  RopeSpec& rope = out.rope;
  rope.kind = RopeKind::standard;
  rope.theta = r.get_number("rope_theta", 10000.0, true);
  const json* params = nullptr;
  std::string where;
  for (const char* f : {"rope_scaling", "rope_parameters"})
    if (const json* p = r.find(f); p && !p->is_null()) {
      if (!p->is_object()) r.bad(f, "wrong type", "an object or null", json_found(*p));
      if (p->empty()) continue;  // Python's `rope_scaling or rope_parameters`
      params = p;
      where = f;
      break;
    }
  if (!params) return out;
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
  if (const json* p = field("partial_rotary_factor"); p && r.as_number(where + ".partial_rotary_factor", *p, true) != 1)
    r.bad(where + ".partial_rotary_factor", "DeepSeek-V3 rotates qk_rope_head_dim dims", "1.0", json_found(*p));
  if (type == "default") return out;
  if (type != "yarn")
    r.bad(where + ".rope_type", "unsupported RoPE type", "one of: yarn, default", json_found(std::string(type)));
  rope.kind = RopeKind::yarn;
  // YaRN's correction range divides by log(theta): a base of 1 or less has no frequencies to interpolate.
  if (rope.theta <= 1)
    r.bad(theta_field, "out of range for YaRN", "a number > 1", fmt::format("{}", rope.theta));
  if (const json* o = field("original_max_position_embeddings"))
    rope.original_max_position = r.as_int(where + ".original_max_position_embeddings", *o, 1, kMaxDim);
  else
    rope.original_max_position = max_positions;  // standardize_rope_params' setdefault
  const bool has_factor = field("factor") != nullptr;
  rope.factor = number("factor", static_cast<double>(max_positions) / static_cast<double>(rope.original_max_position),
                       true);
  // `rope_parameters.get("beta_fast") or 32`: a 0 takes the default too.
  rope.beta_fast = number("beta_fast", 32.0, false);
  if (rope.beta_fast == 0) rope.beta_fast = 32.0;
  rope.beta_slow = number("beta_slow", 1.0, false);
  if (rope.beta_slow == 0) rope.beta_slow = 1.0;
  if (const json* t = field("truncate")) {
    if (!t->is_boolean()) r.bad(where + ".truncate", "wrong type", "true or false", json_found(*t));
    rope.truncate = t->get<bool>();
  } else {
    rope.truncate = true;
  }
  const double mscale = number("mscale", 0.0, false), mscale_all_dim = number("mscale_all_dim", 0.0, false);
  if (const json* af = field("attention_factor"))
    rope.attention_factor = r.as_number(where + ".attention_factor", *af, true);
  else if (mscale != 0 && mscale_all_dim != 0)
    rope.attention_factor = yarn_mscale(rope.factor, mscale) / yarn_mscale(rope.factor, mscale_all_dim);
  else
    rope.attention_factor = yarn_mscale(rope.factor, 1.0);
  // DeepseekV3Attention: scaling = qk_head_dim^-0.5 · mscale², mscale = yarn_get_mscale(factor, mscale_all_dim),
  // read from the config's own `factor` (Transformers fails without one).
  if (mscale_all_dim != 0) {
    if (!has_factor)
      r.missing(where + ".factor", "a number > 0 (the softmax scale's mscale reads it when mscale_all_dim is set)");
    const double m = yarn_mscale(rope.factor, mscale_all_dim);
    out.scale_factor = m * m;
  }
  return out;
}

// A hub field Transformers does not read (the behaviour is hard-coded): accepted when absent, null or the value it
// hard-codes; anything else would run differently there than the checkpoint asks, so it is refused.
void expect_hardcoded(const FieldReader& r, const char* field, const json& value, const std::string& why) {
  const json* v = r.find(field);
  if (!v || v->is_null() || *v == value) return;
  r.bad(field, why, value.dump(), json_found(*v));
}

// num_nextn_predict_layers (what v5 saves) or its alias num_mtp_layers: the MTP modules stored after the decoder
// layers, which DeepseekV3ForCausalLM does not build.
int64_t read_mtp_layers(const FieldReader& r) {
  const bool has_n = r.present_not_null("num_nextn_predict_layers"), has_m = r.present_not_null("num_mtp_layers");
  const int64_t n = has_n ? r.need_int("num_nextn_predict_layers", 0, kMaxLayers) : 1;
  if (has_m) {
    const int64_t m = r.need_int("num_mtp_layers", 0, kMaxLayers);
    if (has_n && m != n) r.bad("num_mtp_layers", "disagrees with num_nextn_predict_layers", std::to_string(n),
                               std::to_string(m));
    return m;
  }
  return n;
}

DecoderSpec parse_deepseek_v3(const FieldReader& r) {
  DecoderSpec s;
  s.norm_rounding = NormRounding::qwen;
  s.vocab_size = r.get_int("vocab_size", 129280);
  s.hidden_size = r.get_int("hidden_size", 7168);
  const int64_t num_layers = r.get_int("num_hidden_layers", 61, 1, kMaxLayers);
  s.max_position_embeddings = r.get_int("max_position_embeddings", 4096);

  AttentionSpec a;
  a.kind = AttentionKind::mla;
  a.heads = r.get_int("num_attention_heads", 128);
  // The keys and values come out of kv_b_proj with one head per query head; Transformers' repeat_kv would break
  // (or, under sdpa's GQA, ignore) a smaller count, so it must be the head count (null: as many, its default).
  a.kv_heads = r.present_not_null("num_key_value_heads") ? r.need_int("num_key_value_heads") : a.heads;
  if (a.kv_heads != a.heads)
    r.bad("num_key_value_heads", "MLA expands keys and values per query head", std::to_string(a.heads),
          std::to_string(a.kv_heads));
  a.q_lora_rank = r.present_not_null("q_lora_rank") ? r.need_int("q_lora_rank")
                  : r.present("q_lora_rank")         ? 0  // null: a plain q_proj
                                                     : 1536;
  a.kv_lora_rank = r.get_int("kv_lora_rank", 512);
  a.qk_nope_head_dim = r.get_int("qk_nope_head_dim", 128);
  a.qk_rope_head_dim = r.get_int("qk_rope_head_dim", 64);
  if (a.qk_rope_head_dim % 2 != 0)
    r.bad("qk_rope_head_dim", "RoPE rotates pairs of dims", "an even number", std::to_string(a.qk_rope_head_dim));
  a.v_head_dim = r.get_int("v_head_dim", 128);
  a.head_dim = a.qk_nope_head_dim + a.qk_rope_head_dim;  // of queries and keys (Transformers' qk_head_dim)
  a.rope.interleaved = r.get_bool("rope_interleave", true);
  if (r.get_bool("attention_bias", false))
    r.bad("attention_bias", "biases on q_a_proj / kv_a_proj_with_mqa / o_proj are not supported yet", "false",
          "true");
  if (r.get_number("attention_dropout", 0.0, false) != 0.0)
    r.bad("attention_dropout", "attention dropout is not supported", "0", json_found(*r.find("attention_dropout")));
  const DsRope rope = read_rope(r, s.max_position_embeddings);
  const int64_t rope_dim = a.qk_rope_head_dim;
  const bool interleaved = a.rope.interleaved;
  a.rope = rope.rope;
  a.rope.rotary_dim = rope_dim;
  a.rope.interleaved = interleaved;
  a.scale = std::pow(static_cast<double>(a.head_dim), -0.5) * rope.scale_factor;

  MlpSpec dense;
  dense.intermediate_size = r.get_int("intermediate_size", 18432);

  MoeSpec m;
  const bool has_nre = r.present("n_routed_experts"), has_nle = r.present("num_local_experts");
  m.num_experts = has_nre ? r.need_int("n_routed_experts") : has_nle ? r.need_int("num_local_experts") : 256;
  if (has_nre && has_nle && r.need_int("num_local_experts") != m.num_experts)
    r.bad("num_local_experts", "disagrees with n_routed_experts", std::to_string(m.num_experts),
          std::to_string(r.need_int("num_local_experts")));
  m.expert.intermediate_size = r.get_int("moe_intermediate_size", 2048);
  m.expert.activation = Activation::swiglu;
  m.router.score = RouterScore::sigmoid_group;
  m.router.correction_bias = true;
  m.router.norm_topk_prob = r.get_bool("norm_topk_prob", true);
  m.router.scale = r.get_number("routed_scaling_factor", 2.5, false);
  // Defaults (8 groups, 4 kept, top-8) are V3's; whether read or defaulted, each must fit the experts, else the field
  // is named (with "(default)" when it is absent).
  auto value_of = [&](const char* field, int64_t v) {
    return r.present(field) ? json_found(*r.find(field)) : fmt::format("{} (the default)", v);
  };
  m.router.groups = r.get_int("n_group", 8);
  // The router takes the top two scores of each group and views the E scores as [groups, E / groups].
  if (m.num_experts % m.router.groups != 0 || m.num_experts / m.router.groups < 2)
    r.bad("n_group", "the experts must split into groups of at least 2",
          fmt::format("a divisor of n_routed_experts = {} leaving >= 2 experts per group", m.num_experts),
          value_of("n_group", m.router.groups));
  m.router.topk_groups = r.get_int("topk_group", 4);
  if (m.router.topk_groups > m.router.groups)
    r.bad("topk_group", "more groups kept than there are",
          fmt::format("an integer in [1, {}] (n_group)", m.router.groups), value_of("topk_group", m.router.topk_groups));
  const int64_t reachable = m.router.topk_groups * (m.num_experts / m.router.groups);
  m.experts_per_token = r.get_int("num_experts_per_tok", 8);
  if (m.experts_per_token > reachable)
    r.bad("num_experts_per_tok", "more experts than the kept groups hold",
          fmt::format("an integer in [1, {}] (topk_group x n_routed_experts / n_group)", reachable),
          value_of("num_experts_per_tok", m.experts_per_token));
  const int64_t shared = r.get_int("n_shared_experts", 1, 1, kMaxDim);
  m.shared_expert = MlpSpec{m.expert.intermediate_size * shared, Activation::swiglu, false};
  m.aux_loss_on = false;  // DeepseekV3ForCausalLM computes no auxiliary loss
  const int64_t first_dense = r.get_int("first_k_dense_replace", 3, 0, kMaxLayers);

  if (std::string act = r.get_string("hidden_act", "silu"); act != "silu")
    r.bad("hidden_act", "unsupported activation", "\"silu\"", json_found(*r.find("hidden_act")));
  const std::string hardcoded = "Transformers' DeepseekV3ForCausalLM hard-codes this behaviour and ignores the field";
  expect_hardcoded(r, "scoring_func", "sigmoid", hardcoded);
  expect_hardcoded(r, "topk_method", "noaux_tc", hardcoded);
  expect_hardcoded(r, "moe_layer_freq", 1, hardcoded);
  read_mtp_layers(r);  // checked here, used by the layout

  s.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  s.padding_idx = read_padding_idx(r, s.vocab_size);  // DeepseekV3Model: nn.Embedding(V, H, pad_token_id)
  s.norm_eps = r.get_number("rms_norm_eps", 1e-6, true);
  s.initializer_range = r.get_number("initializer_range", 0.02, false);
  s.dtype = read_dtype(r);

  check_tensor_size(r, "vocab_size", "embed_tokens", {s.vocab_size, s.hidden_size});
  check_tensor_size(r, "num_attention_heads", "q_b_proj",
                    {a.heads, a.head_dim, a.q_lora_rank > 0 ? a.q_lora_rank : s.hidden_size});
  check_tensor_size(r, "num_attention_heads", "kv_b_proj",
                    {a.heads, a.qk_nope_head_dim + a.v_head_dim, a.kv_lora_rank});
  check_tensor_size(r, "num_attention_heads", "o_proj", {a.heads, a.v_head_dim, s.hidden_size});
  check_tensor_size(r, "kv_lora_rank", "kv_a_proj_with_mqa", {a.kv_lora_rank + a.qk_rope_head_dim, s.hidden_size});
  check_tensor_size(r, "intermediate_size", "mlp.gate_proj", {dense.intermediate_size, s.hidden_size});
  check_tensor_size(r, "n_routed_experts", "mlp.experts.gate_up_proj",
                    {m.num_experts, 2, m.expert.intermediate_size, s.hidden_size});
  check_tensor_size(r, "n_shared_experts", "mlp.shared_experts.gate_proj",
                    {m.shared_expert->intermediate_size, s.hidden_size});

  // mlp[0] and moe[0] are always declared: their sizes are saved back whichever the layers use.
  s.attention = {a};
  s.mlp = {dense};
  s.moe = {m};
  for (int64_t l = 0; l < num_layers; ++l)
    s.layers.push_back({{{SublayerKind::attention, 0}, {l >= first_dense ? SublayerKind::moe : SublayerKind::mlp, 0}}});
  return s;
}

// The layers before the first MoE layer (all of them when none is).
int64_t first_dense_of(const DecoderSpec& s) {
  for (int64_t l = 0; l < s.num_layers(); ++l)
    if (s.is_moe_layer(l)) return l;
  return s.num_layers();
}

json to_json(const DecoderSpec& s) {
  const AttentionSpec& a = s.only_attention();
  const MoeSpec& m = s.moe.at(0);
  json j = config_json_common(s, a);
  // v5 saves head_dim = qk_rope_head_dim (its __post_init__ overwrites it) and qk_head_dim = nope + rope.
  j["head_dim"] = a.qk_rope_head_dim;
  j["qk_head_dim"] = a.head_dim;
  j["q_lora_rank"] = a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = a.kv_lora_rank;
  j["qk_nope_head_dim"] = a.qk_nope_head_dim;
  j["qk_rope_head_dim"] = a.qk_rope_head_dim;
  j["v_head_dim"] = a.value_dim();
  j["rope_interleave"] = a.rope.interleaved;
  j["intermediate_size"] = s.mlp.at(0).intermediate_size;
  j["moe_intermediate_size"] = m.expert.intermediate_size;
  j.erase("num_local_experts");  // v5's canonical spelling
  j["n_routed_experts"] = m.num_experts;
  j["num_experts_per_tok"] = m.experts_per_token;
  j["n_shared_experts"] = m.shared_expert ? m.shared_expert->intermediate_size / m.expert.intermediate_size : 0;
  j["routed_scaling_factor"] = m.router.scale;
  j["n_group"] = m.router.groups;
  j["topk_group"] = m.router.topk_groups;
  j["norm_topk_prob"] = m.router.norm_topk_prob;
  j["first_k_dense_replace"] = first_dense_of(s);
  const FieldReader r{s.raw, s.architecture};
  j.erase("num_mtp_layers");
  j["num_nextn_predict_layers"] = read_mtp_layers(r);
  // v5 folds rope_theta / rope_scaling into rope_parameters ({rope_type, rope_theta, the YaRN keys as given}).
  json rope = config_json_rope_base(j, /*from_legacy=*/true);
  rope["rope_theta"] = a.rope.theta;
  if (a.rope.kind == RopeKind::yarn) {
    rope["rope_type"] = "yarn";
    rope["original_max_position_embeddings"] = a.rope.original_max_position;
  } else {
    rope["rope_type"] = "default";
  }
  config_json_finish(j, s, rope);
  return j;
}

// Transformers' named_parameters() order (a module's parameters in registration order, its buffers after them in
// state_dict): self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}, kv_a_proj_with_mqa, kv_a_layernorm,
// kv_b_proj, o_proj; mlp.{gate,up,down}_proj on dense layers, or mlp.experts.{gate_up_proj, down_proj},
// mlp.gate.{weight, e_score_correction_bias}, mlp.shared_experts.{gate,up,down}_proj; input_layernorm,
// post_attention_layernorm.
ParamTable param_table(const DecoderSpec& s) {
  const int64_t H = s.hidden_size, V = s.vocab_size;
  ParamTable t;
  t.num_experts = s.num_experts();
  t.experts_per_token = s.experts_per_token();
  t.tied_embeddings = s.tie_word_embeddings;
  using U = ParamUse;
  using W = WeightSlot;
  auto add = [&](std::string name, Shape shape, ParamUse use, int64_t layer, int slot,
                 ParamRole role = ParamRole::replicated) {
    add_param(t, std::move(name), std::move(shape), use, layer, slot, role);
  };
  add("model.embed_tokens.weight", {V, H}, U::embedding, -1, W::embed);
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const AttentionSpec* a = s.attention_of(l);
    if (a) {
      MT_CHECK(a->kind == AttentionKind::mla, "DeepSeek-V3 layer {}: attention is not MLA", l);
      const std::string at = p + "self_attn.";
      const int64_t nq = a->heads * a->head_dim;
      if (a->q_lora_rank > 0) {
        add(at + "q_a_proj.weight", {a->q_lora_rank, H}, U::linear, l, W::q_a_proj);
        add(at + "q_a_layernorm.weight", {a->q_lora_rank}, U::norm, l, W::q_a_norm);
        add(at + "q_b_proj.weight", {nq, a->q_lora_rank}, U::linear, l, W::q_b_proj);
      } else {
        add(at + "q_proj.weight", {nq, H}, U::linear, l, W::q_proj);
      }
      add(at + "kv_a_proj_with_mqa.weight", {a->kv_lora_rank + a->qk_rope_head_dim, H}, U::linear, l, W::kv_a_proj);
      add(at + "kv_a_layernorm.weight", {a->kv_lora_rank}, U::norm, l, W::kv_a_norm);
      add(at + "kv_b_proj.weight", {a->heads * (a->qk_nope_head_dim + a->value_dim()), a->kv_lora_rank}, U::linear, l,
          W::kv_b_proj);
      add(at + "o_proj.weight", {H, a->heads * a->value_dim()}, U::linear, l, W::o_proj);
    }
    const MoeSpec* m = s.moe_of(l);
    const MlpSpec* mlp = s.mlp_of(l);
    if (m) {
      const int64_t E = m->num_experts, I = m->expert.intermediate_size;
      // gate_up rows 0..I-1 = gate_proj, I..2I-1 = up_proj (Transformers v5's fused stack).
      add(p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, U::linear, l, W::experts_gate_up, ParamRole::expert_stack);
      add(p + "mlp.experts.down_proj", {E, H, I}, U::linear, l, W::experts_down, ParamRole::expert_stack);
      add(p + "mlp.gate.weight", {E, H}, U::router, l, W::router);
      if (m->router.correction_bias) {
        // _keep_in_fp32_modules_strict: F32 in a bf16 model too; a buffer, zero-initialised, never trained.
        ParamEntry b = param_entry(p + "mlp.gate.e_score_correction_bias", {E}, U::bias, ParamRole::buffer);
        b.dtype = ParamDType::f32;
        b.layer = l;
        b.slot = W::router_score_bias;
        t.add(std::move(b));
      }
      if (m->shared_expert) {
        const int64_t F = m->shared_expert->intermediate_size;
        add(p + "mlp.shared_experts.gate_proj.weight", {F, H}, U::linear, l, W::shared_gate);
        add(p + "mlp.shared_experts.up_proj.weight", {F, H}, U::linear, l, W::shared_up);
        add(p + "mlp.shared_experts.down_proj.weight", {H, F}, U::linear, l, W::shared_down);
      }
    } else if (mlp) {
      const int64_t F = mlp->intermediate_size;
      add(p + "mlp.gate_proj.weight", {F, H}, U::linear, l, W::mlp_gate);
      add(p + "mlp.up_proj.weight", {F, H}, U::linear, l, W::mlp_up);
      add(p + "mlp.down_proj.weight", {H, F}, U::linear, l, W::mlp_down);
    }
    if (a) add(p + "input_layernorm.weight", {H}, U::norm, l, W::input_norm);
    if (m || mlp) add(p + "post_attention_layernorm.weight", {H}, U::norm, l, W::post_norm);
  }
  add("model.norm.weight", {H}, U::norm, -1, W::final_norm);
  if (!s.tie_word_embeddings) add("lm_head.weight", {V, H}, U::lm_head, -1, W::lm_head);
  return t;
}

// hf-numerics.md §8.1, §8.6: the qwen2_moe converter (per-expert gate/up/down stacked, gate rows then up rows),
// any matrix possibly fine-grained FP8 (the hub's V3 quantises every projection), sorted save order; plus the MTP
// layers Transformers does not build (`_keys_to_ignore_on_load_unexpected = model.layers.61.*`, and the
// num_nextn_predict_layers modules stored after the decoder layers of any depth) dropped on load.
HfLayout hf_layout(const DecoderSpec& s) {
  HfLayout l = qwen3_hf_layout(/*moe=*/true, s.tie_word_embeddings);
  const FieldReader r{s.raw, s.architecture};
  const int64_t mtp = s.raw.is_object() ? read_mtp_layers(r) : 0;
  const int64_t L = s.num_layers();
  for (int64_t i = 0; i < mtp; ++i) l.rules.push_back(hf_drop(fmt::format("model.layers.{}.{{*}}", L + i)));
  if (L <= 61 && !(61 < L + mtp)) l.rules.push_back(hf_drop("model.layers.61.{*}"));
  return l;
}

json deepseek_v3_config() {
  return {
      {"architectures", {kDeepseekV3}},
      {"model_type", "deepseek_v3"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"first_k_dense_replace", 3},
      {"hidden_act", "silu"},
      {"hidden_size", 7168},
      {"initializer_range", 0.02},
      {"intermediate_size", 18432},
      {"kv_lora_rank", 512},
      {"max_position_embeddings", 163840},
      {"moe_intermediate_size", 2048},
      {"n_group", 8},
      {"n_routed_experts", 256},
      {"n_shared_experts", 1},
      {"norm_topk_prob", true},
      {"num_attention_heads", 128},
      {"num_experts_per_tok", 8},
      {"num_hidden_layers", 61},
      {"num_key_value_heads", 128},
      {"num_nextn_predict_layers", 1},
      {"q_lora_rank", 1536},
      {"qk_nope_head_dim", 128},
      {"qk_rope_head_dim", 64},
      {"rms_norm_eps", 1e-6},
      {"rope_interleave", true},
      {"rope_scaling",
       {{"beta_fast", 32},
        {"beta_slow", 1},
        {"factor", 40},
        {"mscale", 1.0},
        {"mscale_all_dim", 1.0},
        {"original_max_position_embeddings", 4096},
        {"type", "yarn"}}},
      {"rope_theta", 10000},
      {"routed_scaling_factor", 2.5},
      {"scoring_func", "sigmoid"},
      {"tie_word_embeddings", false},
      {"topk_group", 4},
      {"topk_method", "noaux_tc"},
      {"torch_dtype", "bfloat16"},
      {"v_head_dim", 128},
      {"vocab_size", 129280},
  };
}

json moonlight_config() {
  return {
      {"architectures", {kDeepseekV3}},
      {"model_type", "deepseek_v3"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", 163584},
      {"eos_token_id", 163585},
      {"first_k_dense_replace", 1},
      {"hidden_act", "silu"},
      {"hidden_size", 2048},
      {"initializer_range", 0.02},
      {"intermediate_size", 11264},
      {"kv_lora_rank", 512},
      {"max_position_embeddings", 8192},
      {"moe_intermediate_size", 1408},
      {"moe_layer_freq", 1},
      {"n_group", 1},
      {"n_routed_experts", 64},
      {"n_shared_experts", 2},
      {"norm_topk_prob", true},
      {"num_attention_heads", 16},
      {"num_experts_per_tok", 6},
      {"num_hidden_layers", 27},
      {"num_key_value_heads", 16},
      {"num_nextn_predict_layers", 0},
      {"q_lora_rank", nullptr},
      {"qk_nope_head_dim", 128},
      {"qk_rope_head_dim", 64},
      {"rms_norm_eps", 1e-5},
      {"rope_scaling", nullptr},
      {"rope_theta", 50000.0},
      {"routed_scaling_factor", 2.446},
      {"scoring_func", "sigmoid"},
      {"tie_word_embeddings", false},
      {"topk_group", 1},
      {"topk_method", "noaux_tc"},
      {"torch_dtype", "bfloat16"},
      {"v_head_dim", 128},
      {"vocab_size", 163840},
  };
}

// PEFT's module names: the MLA projections (q_proj without a q LoRA), the dense layers' and the shared experts'
// SwiGLU projections (one name covers both, as PEFT matches module-name suffixes), the routed experts' fused stacks
// (target_parameters) and the router trained in full. Transformers v5 converts deepseek_v3 checkpoints as it does
// qwen3_moe, so gate/up/down_proj go to PEFT as parameters (LoraTargetDef::peft_as_parameter).
std::vector<LoraTargetDef> lora_targets(const DecoderSpec&) {
  using W = WeightSlot;
  return {{"q_proj", {W::q_proj}},
          {"q_a_proj", {W::q_a_proj}},
          {"q_b_proj", {W::q_b_proj}},
          {"kv_a_proj_with_mqa", {W::kv_a_proj}},
          {"kv_b_proj", {W::kv_b_proj}},
          {"o_proj", {W::o_proj}},
          {"gate_proj", {W::mlp_gate, W::shared_gate}, false, false, true},
          {"up_proj", {W::mlp_up, W::shared_up}, false, false, true},
          {"down_proj", {W::mlp_down, W::shared_down}, false, false, true},
          {"experts", {W::experts_gate_up, W::experts_down}},
          {"router", {W::router}, true}};
}

}  // namespace

std::vector<ArchitectureInfo> deepseek_v3_architectures() {
  return {{kDeepseekV3, "deepseek_v3",
           "DeepSeek-V3 decoder (multi-head latent attention with interleaved YaRN RoPE; first layers dense, then "
           "sigmoid group-limited top-k routed SwiGLU experts with a shared expert)",
           &parse_deepseek_v3, &to_json, &param_table, &hf_layout, &lora_targets}};
}

std::vector<PresetInfo> deepseek_v3_presets() {
  return {
      {"deepseek-v3", "DeepSeek-V3 / R1 shapes: 61 layers (3 dense), hidden 7168, MLA, 256 experts top-8 + 1 shared, "
                      "vocab 129280",
       &deepseek_v3_config},
      {"moonlight-16b-a3b", "Moonlight-16B-A3B shapes: 27 layers (1 dense), hidden 2048, MLA without q LoRA, 64 "
                            "experts top-6 + 2 shared, vocab 163840",
       &moonlight_config},
  };
}

}  // namespace mt
