// Qwen3ForCausalLM and Qwen3MoeForCausalLM (hf-numerics.md §1.2, §2, §3): config.json in the hub and the
// Transformers-v5 spellings -> DecoderSpec, the spec back to config.json, the parameter table with
// Transformers' in-memory names, and the presets. The dense Qwen3 is the special case without experts:
// every layer takes the dense MLP.
//
// Every layer is {attention, mlp | moe}: GQA with QK-norm and half-split default RoPE, no biases; a SwiGLU
// MLP, or softmax-top-k routed SwiGLU experts with the Switch load-balancing loss when output_router_logits.
#include <algorithm>

#include "core/error.h"
#include "models/families/families.h"
#include "models/families/family_params.h"
#include "models/model_weights.h"
#include "models/spec/config_reader.h"
#include "models/spec/config_writer.h"

namespace mt {

namespace {

using nlohmann::json;

constexpr const char* kQwen3 = "Qwen3ForCausalLM";
constexpr const char* kQwen3Moe = "Qwen3MoeForCausalLM";

// rope: v5 `rope_parameters` {rope_type, rope_theta, ...} or legacy top-level `rope_theta`
// + `rope_scaling` {type|rope_type, ...}. Only the default (unscaled) RoPE is implemented.
double read_rope_theta(const FieldReader& r) {
  auto check_type = [&](const std::string& obj_field, const json& obj) {
    if (!obj.is_object()) r.bad(obj_field, "wrong type", "an object or null", json_found(obj));
    for (const char* key : {"rope_type", "type"}) {
      auto it = obj.find(key);
      if (it == obj.end()) continue;
      std::string name = obj_field + "." + key;
      if (!it->is_string()) r.bad(name, "wrong type", "a string", json_found(*it));
      if (*it != "default") r.bad(name, "unsupported RoPE type", "one of: default", json_found(*it));
    }
  };
  double theta = r.get_number("rope_theta", 10000.0, true);
  if (const json* sc = r.find("rope_scaling"); sc && !sc->is_null()) check_type("rope_scaling", *sc);
  if (const json* rp = r.find("rope_parameters"); rp && !rp->is_null()) {
    check_type("rope_parameters", *rp);
    if (auto it = rp->find("rope_theta"); it != rp->end()) theta = r.as_number("rope_parameters.rope_theta", *it, true);
  }
  return theta;
}

// The Qwen3-MoE layer rule, as Transformers applies it: MoE iff i not in mlp_only_layers, num_experts > 0 and
// (i + 1) % decoder_sparse_step == 0.
bool qwen_moe_layer(int64_t layer, int64_t experts, int64_t sparse_step, const std::vector<int64_t>& mlp_only) {
  if (experts <= 0 || sparse_step <= 0) return false;
  if (std::find(mlp_only.begin(), mlp_only.end(), layer) != mlp_only.end()) return false;
  return (layer + 1) % sparse_step == 0;
}

// decoder_sparse_step and mlp_only_layers: Qwen3-MoE's layer pattern fields (in the spec as the layer list).
struct LayerPattern {
  int64_t sparse_step = 1;
  std::vector<int64_t> mlp_only;
};

LayerPattern read_layer_pattern(const FieldReader& r, int64_t num_layers) {
  LayerPattern p;
  p.sparse_step = r.get_int("decoder_sparse_step", 1);
  if (const json* v = r.find("mlp_only_layers")) {
    if (!v->is_array()) r.bad("mlp_only_layers", "wrong type", "a list of layer indices", json_found(*v));
    for (size_t i = 0; i < v->size(); ++i)
      p.mlp_only.push_back(r.as_int(fmt::format("mlp_only_layers[{}]", i), (*v)[i], 0, num_layers - 1));
  }
  return p;
}

DecoderSpec parse(const FieldReader& r, bool moe) {
  DecoderSpec s;
  s.norm_rounding = NormRounding::qwen;
  s.vocab_size = r.need_int("vocab_size");
  s.hidden_size = r.need_int("hidden_size");
  const int64_t num_layers = r.need_int("num_hidden_layers", 1, kMaxLayers);

  AttentionSpec a;
  a.kind = AttentionKind::gqa;
  a.qk_norm = true;
  a.heads = r.need_int("num_attention_heads");
  // HF: null means "as many as the query heads"; missing takes the class default (Qwen3-MoE 4, Qwen3 32).
  if (r.present_not_null("num_key_value_heads"))
    a.kv_heads = r.need_int("num_key_value_heads");
  else
    a.kv_heads = r.present("num_key_value_heads") ? a.heads : (moe ? 4 : 32);
  if (a.heads % a.kv_heads != 0)
    r.bad("num_key_value_heads", "num_attention_heads must be a multiple of it",
          fmt::format("a divisor of num_attention_heads = {}", a.heads), std::to_string(a.kv_heads));
  // head_dim: Qwen3Config declares it (default 128); Qwen3MoeConfig does not, so the modelling
  // code falls back to hidden_size / heads. null means "not given" in both.
  if (r.present_not_null("head_dim"))
    a.head_dim = r.need_int("head_dim");
  else if (!moe && !r.present("head_dim"))
    a.head_dim = 128;
  else
    a.head_dim = s.hidden_size / a.heads;
  if (a.head_dim <= 0) r.bad("head_dim", "hidden_size / num_attention_heads is zero", "a positive head_dim", "0");
  if (a.head_dim % 2 != 0)
    r.bad("head_dim", "RoPE rotates the two halves of a head", "an even number", std::to_string(a.head_dim));

  MoeSpec m;
  LayerPattern pattern;
  if (moe) {
    bool has_ne = r.present("num_experts"), has_nle = r.present("num_local_experts");
    if (!has_ne && !has_nle) r.missing("num_experts", "an integer >= 1 (spelled num_experts or num_local_experts)");
    if (has_ne) m.num_experts = r.need_int("num_experts");
    if (has_nle) {
      int64_t n = r.need_int("num_local_experts");
      if (has_ne && n != m.num_experts)
        r.bad("num_local_experts", "disagrees with num_experts", std::to_string(m.num_experts), std::to_string(n));
      m.num_experts = n;
    }
    m.experts_per_token = r.need_int("num_experts_per_tok", 1, m.num_experts);
    m.expert.intermediate_size = r.need_int("moe_intermediate_size");
    m.expert.activation = Activation::swiglu;
    pattern = read_layer_pattern(r, num_layers);
    m.router.score = RouterScore::softmax_topk;
    m.router.norm_topk_prob = r.get_bool("norm_topk_prob", false);
    m.aux_loss_on = r.get_bool("output_router_logits", false);
    m.aux_loss_coef = r.get_number("router_aux_loss_coef", 0.001, false);
  }

  // Layer 0 is dense whenever decoder_sparse_step > 1; mlp_only_layers entries are valid indices.
  MlpSpec mlp;
  const bool any_dense = !moe || pattern.sparse_step > 1 || !pattern.mlp_only.empty();
  mlp.intermediate_size = any_dense ? r.need_int("intermediate_size") : r.get_int("intermediate_size", 6144);

  s.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  s.padding_idx = read_padding_idx(r, s.vocab_size);  // Qwen3(Moe)Model: nn.Embedding(V, H, pad_token_id)
  s.norm_eps = r.get_number("rms_norm_eps", 1e-6, true);
  s.initializer_range = r.get_number("initializer_range", 0.02, false);
  s.max_position_embeddings = r.get_int("max_position_embeddings", 32768);
  a.rope.kind = RopeKind::standard;
  a.rope.theta = read_rope_theta(r);
  s.dtype = read_dtype(r);

  if (std::string act = r.get_string("hidden_act", "silu"); act != "silu")
    r.bad("hidden_act", "unsupported activation", "\"silu\"", json_found(*r.find("hidden_act")));
  if (r.get_bool("use_sliding_window", false))
    r.bad("use_sliding_window", "sliding-window attention is not supported", "false", "true");
  a.qkv_bias = a.o_bias = r.get_bool("attention_bias", false);
  if (a.qkv_bias) r.bad("attention_bias", "attention biases are not supported yet", "false", "true");

  // Tensor sizes must stay far from int64 overflow whatever the fields say.
  check_tensor_size(r, "vocab_size", "embed_tokens", {s.vocab_size, s.hidden_size});
  check_tensor_size(r, "num_attention_heads", "q_proj", {a.heads, a.head_dim, s.hidden_size});
  check_tensor_size(r, "intermediate_size", "mlp.gate_proj", {mlp.intermediate_size, s.hidden_size});
  if (moe) {
    check_tensor_size(r, "num_experts", "mlp.experts.gate_up_proj",
                      {m.num_experts, 2, m.expert.intermediate_size, s.hidden_size});
    check_tensor_size(r, "num_experts", "mlp.gate", {m.num_experts, s.hidden_size});
  }

  // mlp[0] is always declared: its intermediate_size is saved back even when no layer is dense.
  s.attention = {a};
  s.mlp = {mlp};
  if (moe) s.moe = {m};
  for (int64_t l = 0; l < num_layers; ++l) {
    const bool moe_layer = moe && qwen_moe_layer(l, m.num_experts, pattern.sparse_step, pattern.mlp_only);
    s.layers.push_back({{{SublayerKind::attention, 0}, {moe_layer ? SublayerKind::moe : SublayerKind::mlp, 0}}});
  }
  return s;
}

DecoderSpec parse_qwen3(const FieldReader& r) { return parse(r, /*moe=*/false); }
DecoderSpec parse_qwen3_moe(const FieldReader& r) { return parse(r, /*moe=*/true); }

json to_json(const DecoderSpec& s) {
  const AttentionSpec& a = s.only_attention();
  json j = config_json_common(s, a);
  j["intermediate_size"] = s.mlp.at(0).intermediate_size;
  if (!s.moe.empty()) {
    const MoeSpec& m = s.moe[0];
    // The layer pattern as read (the raw file passed its checks when the spec was parsed).
    const FieldReader r{s.raw, s.architecture};
    const LayerPattern pattern = read_layer_pattern(r, s.num_layers());
    // v5 canonical spelling of the expert count.
    j.erase("num_experts");
    j["num_local_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.experts_per_token;
    j["moe_intermediate_size"] = m.expert.intermediate_size;
    j["decoder_sparse_step"] = pattern.sparse_step;
    j["mlp_only_layers"] = pattern.mlp_only;
    j["norm_topk_prob"] = m.router.norm_topk_prob;
    j["output_router_logits"] = m.aux_loss_on;
    j["router_aux_loss_coef"] = m.aux_loss_coef;
  }
  // v5 folds rope_theta / rope_scaling into rope_parameters; keep any extra keys it had.
  json rope = config_json_rope_base(j, /*from_legacy=*/false);
  rope["rope_type"] = "default";
  rope["rope_theta"] = a.rope.theta;
  config_json_finish(j, s, rope);
  return j;
}

std::string layer_prefix(int64_t l) { return fmt::format("model.layers.{}.", l); }

// model.embed_tokens.weight; per layer self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
// mlp.{gate, experts.gate_up_proj, experts.down_proj} (MoE layers) or mlp.{gate,up,down}_proj (dense ones),
// input_layernorm, post_attention_layernorm; model.norm.weight; lm_head.weight (untied only). A layer lists the
// parameters of the sublayers it has, each with its norm (input_layernorm before the attention,
// post_attention_layernorm before the MLP or MoE), so a spec whose layers were edited (tests) gets its table.
ParamTable param_table(const DecoderSpec& s) {
  const int64_t H = s.hidden_size, V = s.vocab_size;
  ParamTable t;
  t.num_experts = s.num_experts();
  t.experts_per_token = s.experts_per_token();
  t.tied_embeddings = s.tie_word_embeddings;
  auto add = [&](std::string name, Shape shape, ParamUse use, int64_t layer, int slot,
                 ParamRole role = ParamRole::replicated) {
    add_param(t, std::move(name), std::move(shape), use, layer, slot, role);
  };
  using U = ParamUse;
  using W = WeightSlot;
  add("model.embed_tokens.weight", {V, H}, U::embedding, -1, W::embed);
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const std::string p = layer_prefix(l);
    const AttentionSpec* a = s.attention_of(l);
    if (a) {
      const int64_t D = a->head_dim;
      // attention_bias (refused by parse until the CUDA engine has bias kernels; a spec edited in code that asks
      // for biases gets their entries, so its weights are checked for them).
      add_attention_projections(t, p + "self_attn.", *a, H, l);
      add(p + "self_attn.q_norm.weight", {D}, U::norm, l, W::q_norm);
      add(p + "self_attn.k_norm.weight", {D}, U::norm, l, W::k_norm);
    }
    const MoeSpec* m = s.moe_of(l);
    const MlpSpec* mlp = s.mlp_of(l);
    if (m) {
      const int64_t E = m->num_experts, I = m->expert.intermediate_size;
      add(p + "mlp.gate.weight", {E, H}, U::router, l, W::router);
      // Stacked as Transformers v5 holds them: gate_up rows 0..I-1 = gate_proj, I..2I-1 = up_proj.
      add(p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, U::linear, l, W::experts_gate_up, ParamRole::expert_stack);
      add(p + "mlp.experts.down_proj", {E, H, I}, U::linear, l, W::experts_down, ParamRole::expert_stack);
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

// Transformers converts (and so sorts on save) by architecture, whatever the layer pattern.
HfLayout hf_layout(const DecoderSpec& s) {
  return qwen3_hf_layout(s.architecture == kQwen3Moe, s.tie_word_embeddings);
}

json qwen3_moe_base() {
  return {
      {"architectures", {kQwen3Moe}},
      {"model_type", "qwen3_moe"},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"decoder_sparse_step", 1},
      {"mlp_only_layers", json::array()},
      {"norm_topk_prob", true},
      {"output_router_logits", false},
      {"router_aux_loss_coef", 0.001},
      {"rms_norm_eps", 1e-6},
      {"initializer_range", 0.02},
      {"use_sliding_window", false},
      {"sliding_window", nullptr},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}},
      {"bos_token_id", 151643},
      {"eos_token_id", 151645},
      {"dtype", "bfloat16"},
  };
}

json qwen3_moe_preset(std::initializer_list<std::pair<const char*, json>> overrides) {
  json j = qwen3_moe_base();
  for (const auto& [k, v] : overrides) j[k] = v;
  return j;
}

}  // namespace

// hf-numerics.md §3.3, §8.1 (the qwen2_moe conversion): the hub stores each expert's gate_proj / up_proj /
// down_proj; Transformers v5 stacks them on load (gate rows, then up rows, in gate_up_proj) and splits them back on
// save. A checkpoint saved with save_original_format=False holds the fused tensors instead. Any weight may come
// FP8 block-quantised (§8.6), dequantised on load. A model Transformers
// converts on load (qwen3_moe) is saved sorted by in-memory name; the dense Qwen3 keeps state_dict order.
HfLayout qwen3_hf_layout(bool moe, bool tied_embeddings) {
  HfLayout l;
  const std::string x = "model.layers.{L}.mlp.experts.";
  l.rules.push_back(hf_param(x + "gate_up_proj",
                             hf_one_of({hf_concat(1, {hf_stack_experts(hf_tensor(x + "{E}.gate_proj.weight")),
                                                      hf_stack_experts(hf_tensor(x + "{E}.up_proj.weight"))}),
                                        hf_tensor(x + "gate_up_proj")})));
  l.rules.push_back(hf_param(x + "down_proj", hf_one_of({hf_stack_experts(hf_tensor(x + "{E}.down_proj.weight")),
                                                         hf_tensor(x + "down_proj")})));
  if (tied_embeddings) {  // HF ignores a stored copy of a tied head (and its FP8 scales)
    l.rules.push_back(hf_drop("lm_head.weight"));
    l.rules.push_back(hf_drop("lm_head.weight_scale_inv"));
  }
  // Qwen's fine-grained FP8 checkpoints (Qwen3-30B-A3B-FP8: e4m3, 128x128 blocks) quantise the linear layers and
  // leave norms, embeddings, the head and the routers in bf16; the reader takes whatever carries a scale_inv.
  l.fp8_any_matrix = true;
  l.save_order = moe ? HfSaveOrder::sorted_by_param : HfSaveOrder::state_dict;
  return l;
}

namespace {
// PEFT's module names: the attention projections, a dense layer's MLP projections, the routed experts (both fused
// stacks, through PEFT's target_parameters), and the router trained in full.
std::vector<LoraTargetDef> lora_targets(const DecoderSpec& s) {
  using W = WeightSlot;
  // Qwen3-MoE's dense layers (mlp_only_layers): PEFT would read gate/up/down_proj in target_modules as expert names.
  const bool as_parameter = s.architecture == kQwen3Moe;
  return {{"q_proj", {W::q_proj}},
          {"k_proj", {W::k_proj}},
          {"v_proj", {W::v_proj}},
          {"o_proj", {W::o_proj}},
          {"gate_proj", {W::mlp_gate}, false, false, as_parameter},
          {"up_proj", {W::mlp_up}, false, false, as_parameter},
          {"down_proj", {W::mlp_down}, false, false, as_parameter},
          {"experts", {W::experts_gate_up, W::experts_down}},
          {"router", {W::router}, true}};
}
}  // namespace

std::vector<ArchitectureInfo> qwen3_architectures() {
  return {
      {kQwen3, "qwen3", "Qwen3 dense decoder (QK-norm, GQA, SwiGLU MLP)", &parse_qwen3, &to_json, &param_table,
       &hf_layout, &lora_targets},
      {kQwen3Moe, "qwen3_moe", "Qwen3-MoE decoder (Qwen3 attention, top-k routed SwiGLU experts)",
       &parse_qwen3_moe, &to_json, &param_table, &hf_layout, &lora_targets},
  };
}

std::vector<PresetInfo> qwen3_presets() {
  return {
      {"qwen3-30b-a3b", "Qwen3-30B-A3B shapes: 48 layers, hidden 2048, 128 experts top-8, vocab 151936",
       [] {
         return qwen3_moe_preset({{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 6144},
                                  {"moe_intermediate_size", 768}, {"num_hidden_layers", 48},
                                  {"num_attention_heads", 32}, {"num_key_value_heads", 4}, {"head_dim", 128},
                                  {"num_experts", 128}, {"num_experts_per_tok", 8}, {"max_position_embeddings", 40960},
                                  {"tie_word_embeddings", false}});
       }},
      {"qwen3-moe-tiny", "quickstart size: 4 layers, hidden 128, 8 experts top-2, Qwen3 vocabulary (151936)",
       [] {
         return qwen3_moe_preset({{"vocab_size", 151936}, {"hidden_size", 128}, {"intermediate_size", 384},
                                  {"moe_intermediate_size", 128}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                                  {"num_key_value_heads", 2}, {"head_dim", 32}, {"num_experts", 8},
                                  {"num_experts_per_tok", 2}, {"max_position_embeddings", 4096},
                                  {"tie_word_embeddings", true}});
       }},
      {"qwen3-moe-test", "test size: 2 layers, hidden 64, 8 experts top-2, vocab 512",
       [] {
         return qwen3_moe_preset({{"vocab_size", 512}, {"hidden_size", 64}, {"intermediate_size", 128},
                                  {"moe_intermediate_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                  {"num_key_value_heads", 2}, {"head_dim", 16}, {"num_experts", 8},
                                  {"num_experts_per_tok", 2}, {"max_position_embeddings", 1024},
                                  {"tie_word_embeddings", false}, {"initializer_range", 0.1}, {"bos_token_id", 1},
                                  {"eos_token_id", 2}, {"dtype", "float32"}});
       }},
  };
}

}  // namespace mt
