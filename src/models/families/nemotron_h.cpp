// NemotronHForCausalLM (Nemotron-H, NVIDIA Nemotron 3 Nano; hf-numerics.md §1.2, §6, §8.1): config.json in the hub
// and the Transformers-v5 spellings -> DecoderSpec, the spec back to config.json, the parameter table with
// Transformers' in-memory names, the checkpoint layout and the presets.
//
// Every layer is ONE sublayer with one pre-norm (model.layers.L.norm): a Mamba2 mixer (M), sigmoid-routed ReLU²
// experts beside a ReLU² shared expert (E), grouped-query attention without positional encoding (*), or a dense ReLU²
// MLP (-), from `layers_block_type` or the hub's `hybrid_override_pattern`. The experts are up/down only (no gate),
// the router is DeepSeek-V3's (fp32, sigmoid + e_score_correction_bias for the selection, group-limited top-k), with
// no load-balancing loss. RMSNorm rounds as Qwen's; the logits are fp32.
//
// Quirks of Transformers 5.17 followed here: d_inner = mamba_num_heads · mamba_head_dim (`expand` is not read); the
// legacy mamba_* spellings win over the v5 fields when both are present (NemotronHConfig.__post_init__);
// layers_block_type wins over hybrid_override_pattern and num_hidden_layers is derived from it (a stored one is
// ignored); the attention has no bias whatever attention_bias says; exactly one shared expert of
// moe_shared_expert_intermediate_size whatever n_shared_experts says; NemotronHForCausalLM ties nothing
// (_tied_weights_keys = {}), so lm_head is its own weight even with tie_word_embeddings; no padding row in the
// embedding; dt is clamped below at time_step_min only (time_step_limit and residual_in_fp32 are not read by the
// forward); `mtp.*` tensors are ignored on load. Refused rather than run differently: mlp_bias (biased dense/shared
// MLPs), moe_latent_size (latent expert projections), an activation other than SiLU (Mamba) or ReLU² (MLPs),
// attention dropout.
#include <string>
#include <vector>

#include "core/error.h"
#include "models/families/families.h"
#include "models/families/family_params.h"
#include "models/model_weights.h"
#include "models/spec/config_reader.h"

namespace mt {

namespace {

using nlohmann::json;

constexpr const char* kNemotronH = "NemotronHForCausalLM";

// The four layer kinds in v5's spelling (what save_pretrained writes), the hub pattern's letter for each, and the
// legacy spellings v5 still reads (remap_legacy_layer_types).
struct KindName {
  SublayerKind kind;
  const char* v5;
  const char* legacy;  // nullptr: none
  char letter;
};
constexpr KindName kKinds[] = {{SublayerKind::mamba2, "linear_attention", "mamba", 'M'},
                               {SublayerKind::moe, "moe", nullptr, 'E'},
                               {SublayerKind::attention, "full_attention", "attention", '*'},
                               {SublayerKind::mlp, "mlp", nullptr, '-'}};

const KindName& kind_name(SublayerKind k) {
  for (const KindName& n : kKinds)
    if (n.kind == k) return n;
  fail("nemotron_h: layer kind {} has no name", sublayer_kind_name(k));
}

// The v5 field, or its legacy mamba_* spelling when that is present (which wins, as in __post_init__).
std::string field_of(const FieldReader& r, const char* v5, const char* legacy) {
  return r.present(legacy) ? legacy : v5;
}

// layers_block_type (or its attribute_map alias layer_types), else hybrid_override_pattern, else v5's default
// [linear_attention, moe, full_attention, mlp]. A null list counts as absent, as in Python.
std::vector<SublayerKind> read_layer_kinds(const FieldReader& r) {
  std::vector<SublayerKind> kinds;
  const bool has_list = r.present_not_null("layers_block_type"), has_alias = r.present_not_null("layer_types");
  if (has_list && has_alias && *r.find("layers_block_type") != *r.find("layer_types"))
    r.bad("layer_types", "disagrees with layers_block_type (one is an alias of the other)", "the same list",
          "another list");
  if (has_list || has_alias) {
    const std::string f = has_list ? "layers_block_type" : "layer_types";
    const json& v = *r.find(f);
    const char* expected = "a non-empty list of \"linear_attention\", \"moe\", \"full_attention\", \"mlp\"";
    if (!v.is_array() || v.empty()) r.bad(f, "wrong type", expected, json_found(v));
    if (v.size() > static_cast<size_t>(kMaxLayers))
      r.bad(f, "too many layers", fmt::format("at most {} entries", kMaxLayers), json_found(v));
    for (size_t i = 0; i < v.size(); ++i) {
      const json& e = v[i];
      const KindName* hit = nullptr;
      if (e.is_string())
        for (const KindName& n : kKinds)
          if (e == n.v5 || (n.legacy && e == n.legacy)) hit = &n;
      if (!hit) r.bad(fmt::format("{}[{}]", f, i), "unknown layer type", expected, json_found(e));
      kinds.push_back(hit->kind);
    }
    return kinds;
  }
  if (r.present_not_null("hybrid_override_pattern")) {
    const json& v = *r.find("hybrid_override_pattern");
    const char* expected = "a non-empty string of M (Mamba2), E (MoE), * (attention), - (MLP)";
    if (!v.is_string() || v.get_ref<const std::string&>().empty())
      r.bad("hybrid_override_pattern", "wrong type", expected, json_found(v));
    const std::string& p = v.get_ref<const std::string&>();
    if (p.size() > static_cast<size_t>(kMaxLayers))
      r.bad("hybrid_override_pattern", "too many layers", fmt::format("at most {} letters", kMaxLayers),
            json_found(v));
    for (size_t i = 0; i < p.size(); ++i) {
      const KindName* hit = nullptr;
      for (const KindName& n : kKinds)
        if (p[i] == n.letter) hit = &n;
      if (!hit)
        r.bad("hybrid_override_pattern", fmt::format("unknown layer letter at position {}", i), expected,
              json_found(v));
      kinds.push_back(hit->kind);
    }
    return kinds;
  }
  return {SublayerKind::mamba2, SublayerKind::moe, SublayerKind::attention, SublayerKind::mlp};
}

// The error when a value read is not the one the engine runs: "(the default)" when the field is absent.
std::string value_of(const FieldReader& r, const std::string& field, int64_t v) {
  return r.present(field) ? json_found(*r.find(field)) : fmt::format("{} (the default)", v);
}

Mamba2Spec read_mamba2(const FieldReader& r, double norm_eps) {
  Mamba2Spec m;
  m.heads = r.get_int("mamba_num_heads", 128);
  m.head_dim = r.get_int("mamba_head_dim", 64);
  m.state = r.get_int("ssm_state_size", 128);
  const std::string groups = field_of(r, "n_groups", "mamba_n_groups");
  m.groups = r.get_int(groups, 8);
  // Each group's B and C serve heads / groups heads (repeat_interleave), and the gated norm's groups split d_inner.
  if (m.heads % m.groups != 0)
    r.bad(groups, "the Mamba heads must split into the groups",
          fmt::format("a divisor of mamba_num_heads = {}", m.heads), value_of(r, groups, m.groups));
  m.conv_kernel = r.get_int(field_of(r, "conv_kernel", "mamba_d_conv"), 4);
  m.chunk = r.get_int(field_of(r, "chunk_size", "mamba_chunk_size"), 128);
  m.conv_bias = r.get_bool(field_of(r, "use_conv_bias", "mamba_conv_bias"), true);
  m.proj_bias = r.get_bool("use_bias", false);
  m.norm_eps = norm_eps;
  // The init draws log-uniformly between them, so both must be positive.
  m.time_step_min = r.get_number(field_of(r, "time_step_min", "mamba_dt_min"), 1e-3, true);
  m.time_step_max = r.get_number(field_of(r, "time_step_max", "mamba_dt_max"), 0.1, true);
  m.time_step_floor = r.get_number(field_of(r, "time_step_floor", "mamba_dt_init_floor"), 1e-4, false);
  const std::string act = r.get_string("mamba_hidden_act", "silu");
  if (act != "silu" && act != "swish")
    r.bad("mamba_hidden_act", "unsupported activation", "\"silu\"", json_found(*r.find("mamba_hidden_act")));
  return m;
}

MoeSpec read_moe(const FieldReader& r) {
  MoeSpec m;
  const bool has_nre = r.present("n_routed_experts"), has_nle = r.present("num_local_experts");
  m.num_experts = has_nre ? r.need_int("n_routed_experts") : has_nle ? r.need_int("num_local_experts") : 8;
  if (has_nre && has_nle && r.need_int("num_local_experts") != m.num_experts)
    r.bad("num_local_experts", "disagrees with n_routed_experts", std::to_string(m.num_experts),
          std::to_string(r.need_int("num_local_experts")));
  const std::string experts_field = has_nre || !has_nle ? "n_routed_experts" : "num_local_experts";
  m.expert.intermediate_size = r.get_int("moe_intermediate_size", 7688);
  m.expert.activation = Activation::relu2;
  m.router.score = RouterScore::sigmoid_group;
  m.router.correction_bias = true;
  m.router.norm_topk_prob = r.get_bool("norm_topk_prob", true);
  m.router.scale = r.get_number("routed_scaling_factor", 1.0, false);
  m.router.groups = r.get_int("n_group", 1);
  // route_tokens_to_experts takes the top two scores of each group (also with one group), so every group needs 2.
  if (m.num_experts % m.router.groups != 0 || m.num_experts / m.router.groups < 2)
    r.bad(m.router.groups == 1 ? experts_field : "n_group", "the experts must split into groups of at least 2",
          fmt::format("n_group dividing n_routed_experts = {} with >= 2 experts per group", m.num_experts),
          m.router.groups == 1 ? value_of(r, experts_field, m.num_experts) : value_of(r, "n_group", m.router.groups));
  m.router.topk_groups = r.get_int("topk_group", 1);
  if (m.router.topk_groups > m.router.groups)
    r.bad("topk_group", "more groups kept than there are",
          fmt::format("an integer in [1, {}] (n_group)", m.router.groups),
          value_of(r, "topk_group", m.router.topk_groups));
  const int64_t reachable = m.router.topk_groups * (m.num_experts / m.router.groups);
  m.experts_per_token = r.get_int("num_experts_per_tok", 2);
  if (m.experts_per_token > reachable)
    r.bad("num_experts_per_tok", "more experts than the kept groups hold",
          fmt::format("an integer in [1, {}] (topk_group x n_routed_experts / n_group)", reachable),
          value_of(r, "num_experts_per_tok", m.experts_per_token));
  // NemotronHMoE builds one shared expert of this size, whatever n_shared_experts says (read for its type only).
  r.get_int("n_shared_experts", 1, 0, kMaxDim);
  m.shared_expert = MlpSpec{r.get_int("moe_shared_expert_intermediate_size", 7688), Activation::relu2, false};
  m.aux_loss_on = false;  // NemotronHForCausalLM computes no auxiliary loss
  if (r.present_not_null("moe_latent_size"))
    r.bad("moe_latent_size", "latent expert projections (fc1/fc2_latent_proj) are not supported", "null",
          json_found(*r.find("moe_latent_size")));
  return m;
}

DecoderSpec parse_nemotron_h(const FieldReader& r) {
  DecoderSpec s;
  s.norm_rounding = NormRounding::qwen;
  s.vocab_size = r.get_int("vocab_size", 131072);
  s.hidden_size = r.get_int("hidden_size", 4096);
  s.max_position_embeddings = r.get_int("max_position_embeddings", 4096);
  const std::vector<SublayerKind> kinds = read_layer_kinds(r);
  r.get_int("num_hidden_layers", 0, 0, kMaxLayers);  // derived from the layer list; a stored value is ignored
  // layer_norm_epsilon, or the hub's norm_eps when it is the only one given.
  s.norm_eps = r.present("layer_norm_epsilon") || !r.present("norm_eps")
                   ? r.get_number("layer_norm_epsilon", 1e-5, true)
                   : r.get_number("norm_eps", 1e-5, true);

  AttentionSpec a;
  a.kind = AttentionKind::gqa;
  a.heads = r.get_int("num_attention_heads", 32);
  // null: as many as the query heads (NemotronHConfig's backward compatibility).
  a.kv_heads = r.present_not_null("num_key_value_heads") ? r.need_int("num_key_value_heads")
               : r.present("num_key_value_heads")         ? a.heads
                                                          : 8;
  if (a.heads % a.kv_heads != 0)
    r.bad("num_key_value_heads", "num_attention_heads must be a multiple of it",
          fmt::format("a divisor of num_attention_heads = {}", a.heads), std::to_string(a.kv_heads));
  a.head_dim = r.get_int("head_dim", 128);
  a.rope.kind = RopeKind::none;  // NoPE: rope_theta, when a hub config has it, is not read
  a.scale = 0;                   // head_dim^-1/2
  r.get_bool("attention_bias", false);  // NemotronHAttention has no bias whatever this says
  if (r.get_number("attention_dropout", 0.0, false) != 0.0)
    r.bad("attention_dropout", "attention dropout is not supported", "0", json_found(*r.find("attention_dropout")));

  MlpSpec dense{r.get_int("intermediate_size", 21504), Activation::relu2, false};
  if (const std::string act = r.get_string("mlp_hidden_act", "relu2"); act != "relu2")
    r.bad("mlp_hidden_act", "unsupported activation", "\"relu2\"", json_found(*r.find("mlp_hidden_act")));
  if (r.get_bool("mlp_bias", false))
    r.bad("mlp_bias", "biases on the dense and shared-expert MLPs are not supported yet", "false", "true");

  const MoeSpec moe = read_moe(r);
  const Mamba2Spec mamba = read_mamba2(r, s.norm_eps);
  r.get_int("num_nextn_predict_layers", 0, 0, kMaxLayers);  // MTP modules: not built, their tensors ignored

  // _tied_weights_keys = {}: Transformers never ties the head to the embedding (tie_word_embeddings read for its
  // type only and saved back as it was).
  r.get_bool("tie_word_embeddings", false);
  s.tie_word_embeddings = false;
  s.initializer_range = r.get_number("initializer_range", 0.02, false);
  s.dtype = read_dtype(r);

  check_tensor_size(r, "vocab_size", "embeddings", {s.vocab_size, s.hidden_size});
  check_tensor_size(r, "num_attention_heads", "q_proj", {a.heads, a.head_dim, s.hidden_size});
  check_tensor_size(r, "intermediate_size", "mixer.up_proj", {dense.intermediate_size, s.hidden_size});
  check_tensor_size(r, "n_routed_experts", "mixer.experts.up_proj",
                    {moe.num_experts, moe.expert.intermediate_size, s.hidden_size});
  check_tensor_size(r, "moe_shared_expert_intermediate_size", "mixer.shared_experts.up_proj",
                    {moe.shared_expert->intermediate_size, s.hidden_size});
  check_tensor_size(r, "mamba_num_heads", "mixer.out_proj", {mamba.heads, mamba.head_dim, s.hidden_size});
  // in_proj: [d_inner + conv_dim + heads, H] = [2·heads·head_dim + 2·groups·state + heads, H].
  check_tensor_size(r, "ssm_state_size", "mixer.in_proj", {mamba.groups, mamba.state, 2 * s.hidden_size});
  check_tensor_size(r, "mamba_num_heads", "mixer.in_proj", {mamba.heads, 2 * mamba.head_dim + 1, s.hidden_size});

  // One configuration of each kind is always declared: their sizes are saved back whichever the layers use.
  s.attention = {a};
  s.mlp = {dense};
  s.moe = {moe};
  s.mamba2 = {mamba};
  for (SublayerKind k : kinds) s.layers.push_back({{{k, 0}}});
  return s;
}

json to_json(const DecoderSpec& s) {
  const AttentionSpec& a = s.attention.at(0);
  const MoeSpec& m = s.moe.at(0);
  const Mamba2Spec& mb = s.mamba2.at(0);
  json j = s.raw.is_object() ? s.raw : json::object();
  if (!j.contains("architectures")) j["architectures"] = json::array({s.architecture});
  j["model_type"] = s.model_type;
  j["vocab_size"] = s.vocab_size;
  j["hidden_size"] = s.hidden_size;
  // v5 saves the layer list (kinds in its spelling) and derives the count from it.
  json kinds = json::array();
  for (const LayerSpec& l : s.layers) kinds.push_back(kind_name(l.sublayers.at(0).kind).v5);
  j["layers_block_type"] = kinds;
  for (const char* gone : {"hybrid_override_pattern", "layer_types", "num_hidden_layers", "num_local_experts",
                           "torch_dtype"})
    j.erase(gone);
  // The legacy mamba_* spellings become the v5 fields (the value read, whichever spelling it came from).
  const FieldReader r{s.raw, s.architecture};
  for (const auto& [v5, legacy] : {std::pair{"expand", "mamba_expand"}, std::pair{"time_step_limit", "mamba_dt_limit"}})
    if (r.present(legacy)) {
      j[v5] = *r.find(legacy);
      j.erase(legacy);
    }
  for (const char* legacy : {"mamba_n_groups", "mamba_d_conv", "mamba_dt_min", "mamba_dt_max", "mamba_dt_init_floor",
                             "mamba_conv_bias", "mamba_chunk_size"})
    j.erase(legacy);
  j["num_attention_heads"] = a.heads;
  j["num_key_value_heads"] = a.kv_heads;
  j["head_dim"] = a.head_dim;
  j["intermediate_size"] = s.mlp.at(0).intermediate_size;
  j["mamba_num_heads"] = mb.heads;
  j["mamba_head_dim"] = mb.head_dim;
  j["ssm_state_size"] = mb.state;
  j["n_groups"] = mb.groups;
  j["conv_kernel"] = mb.conv_kernel;
  j["chunk_size"] = mb.chunk;
  j["use_conv_bias"] = mb.conv_bias;
  j["use_bias"] = mb.proj_bias;
  j["time_step_min"] = mb.time_step_min;
  j["time_step_max"] = mb.time_step_max;
  j["time_step_floor"] = mb.time_step_floor;
  j["n_routed_experts"] = m.num_experts;
  j["num_experts_per_tok"] = m.experts_per_token;
  j["moe_intermediate_size"] = m.expert.intermediate_size;
  j["moe_shared_expert_intermediate_size"] = m.shared_expert->intermediate_size;
  j["routed_scaling_factor"] = m.router.scale;
  j["n_group"] = m.router.groups;
  j["topk_group"] = m.router.topk_groups;
  j["norm_topk_prob"] = m.router.norm_topk_prob;
  j["layer_norm_epsilon"] = s.norm_eps;
  j["initializer_range"] = s.initializer_range;
  j["max_position_embeddings"] = s.max_position_embeddings;
  j["dtype"] = std::string(dtype_torch_name(s.dtype));
  return j;
}

// Transformers' named_parameters() order: model.embeddings; per layer its norm, then the mixer's parameters in
// registration order (Mamba2: conv1d, in_proj, dt_bias, A_log, norm, D, out_proj; MoE: experts.up_proj, down_proj,
// gate.weight + its buffer, shared_experts.up_proj, down_proj; attention: q, k, v, o; MLP: up_proj, down_proj);
// model.norm_f; lm_head. The layer norm takes the slot its sublayer's block reads: input_norm before attention and
// Mamba2, post_norm before MoE and MLP.
ParamTable param_table(const DecoderSpec& s) {
  const int64_t H = s.hidden_size, V = s.vocab_size;
  ParamTable t;
  t.num_experts = s.num_experts();
  t.experts_per_token = s.experts_per_token();
  t.tied_embeddings = false;
  using U = ParamUse;
  using W = WeightSlot;
  using R = ParamRole;
  auto add = [&](std::string name, Shape shape, ParamUse use, int64_t layer, int slot, ParamRole role = R::replicated,
                 std::optional<ParamInit> init = std::nullopt) {
    add_param(t, std::move(name), std::move(shape), use, layer, slot, role, init);
  };
  add("model.embeddings.weight", {V, H}, U::embedding, -1, W::embed);
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const std::vector<Sublayer>& subs = s.layers[static_cast<size_t>(l)].sublayers;
    MT_CHECK(subs.size() == 1, "Nemotron-H layer {}: {} sublayers, one expected", l, subs.size());
    const SublayerKind kind = subs[0].kind;
    const std::string p = fmt::format("model.layers.{}.", l), x = p + "mixer.";
    const bool ffn = kind == SublayerKind::moe || kind == SublayerKind::mlp;
    add(p + "norm.weight", {H}, U::norm, l, ffn ? W::post_norm : W::input_norm);
    if (const Mamba2Spec* m = s.mamba2_of(l)) {
      const int64_t C = m->conv_dim(), P = m->in_proj_dim(), Di = m->inner(), nh = m->heads;
      add(x + "conv1d.weight", {C, 1, m->conv_kernel}, U::ssm, l, W::mamba_conv_weight);
      if (m->conv_bias) add(x + "conv1d.bias", {C}, U::bias, l, W::mamba_conv_bias);
      add(x + "in_proj.weight", {P, H}, U::linear, l, W::mamba_in_proj);
      if (m->proj_bias) add(x + "in_proj.bias", {P}, U::bias, l, W::mamba_in_proj_bias);
      add(x + "dt_bias", {nh}, U::bias, l, W::mamba_dt_bias, R::replicated, ParamInit::dt_bias);
      add(x + "A_log", {nh}, U::ssm, l, W::mamba_a_log, R::replicated, ParamInit::a_log);
      add(x + "norm.weight", {Di}, U::norm, l, W::mamba_norm);
      add(x + "D", {nh}, U::ssm, l, W::mamba_d, R::replicated, ParamInit::ones);
      add(x + "out_proj.weight", {H, Di}, U::linear, l, W::mamba_out_proj);
      if (m->proj_bias) add(x + "out_proj.bias", {H}, U::bias, l, W::mamba_out_proj_bias);
    } else if (const MoeSpec* m = s.moe_of(l)) {
      const int64_t E = m->num_experts, I = m->expert.intermediate_size;
      add(x + "experts.up_proj", {E, I, H}, U::linear, l, W::experts_gate_up, R::expert_stack);
      add(x + "experts.down_proj", {E, H, I}, U::linear, l, W::experts_down, R::expert_stack);
      add(x + "gate.weight", {E, H}, U::router, l, W::router);
      // _keep_in_fp32_modules_strict: F32 in a bf16 model too; a buffer, zero-initialised, never trained.
      ParamEntry b = param_entry(x + "gate.e_score_correction_bias", {E}, U::bias, R::buffer);
      b.dtype = ParamDType::f32;
      b.layer = l;
      b.slot = W::router_score_bias;
      t.add(std::move(b));
      const int64_t F = m->shared_expert->intermediate_size;
      add(x + "shared_experts.up_proj.weight", {F, H}, U::linear, l, W::shared_up);
      add(x + "shared_experts.down_proj.weight", {H, F}, U::linear, l, W::shared_down);
    } else if (const AttentionSpec* a = s.attention_of(l)) {
      add_attention_projections(t, x, *a, H, l);
    } else if (const MlpSpec* m = s.mlp_of(l)) {
      add(x + "up_proj.weight", {m->intermediate_size, H}, U::linear, l, W::mlp_up);
      add(x + "down_proj.weight", {H, m->intermediate_size}, U::linear, l, W::mlp_down);
    }
  }
  // HF Trainer's decay rule is by name ("bias", "layernorm", "rmsnorm", a ".norm." or "_norm." component): norm_f
  // matches none of them, so Transformers decays it (train/adamw.h adamw_hf_decays says the same).
  ParamEntry norm_f = param_entry("model.norm_f.weight", {H}, U::norm);
  norm_f.slot = W::final_norm;
  norm_f.decay = true;
  t.add(std::move(norm_f));
  add("lm_head.weight", {V, H}, U::lm_head, -1, W::lm_head);
  return t;
}

// hf-numerics.md §6.3, §8.1: the checkpoint says `backbone.` where memory says `model.` (WeightRenaming), the routed
// experts are stored one by one (up_proj, down_proj per expert, stacked on load and split back on save), the MTP
// module's tensors are ignored (_keys_to_ignore_on_load_unexpected = mtp.*). Transformers converts this model type on
// load, so save_pretrained writes it sorted by in-memory name (as the fixture checkpoints' shards show).
HfLayout hf_layout(const DecoderSpec&) {
  HfLayout l;
  l.rules.push_back(hf_rename("backbone.", "model."));
  const std::string x = "model.layers.{L}.mixer.experts.";
  l.rules.push_back(hf_param(x + "up_proj", hf_stack_experts(hf_tensor(x + "{E}.up_proj.weight"))));
  l.rules.push_back(hf_param(x + "down_proj", hf_stack_experts(hf_tensor(x + "{E}.down_proj.weight"))));
  l.rules.push_back(hf_drop("mtp.{*}"));
  l.save_order = HfSaveOrder::sorted_by_param;
  return l;
}

// PEFT's module names (every layer kind's module is `mixer`): the attention projections, the Mamba2 mixer's in_proj
// (its bias, with use_bias, stays frozen; out_proj is known but refused: PEFT's _check_lora_target_modules_mamba
// rejects out_proj and conv1d on nemotron_h, so an adapter holding it would not load in PEFT), the ReLU² up/down
// projections of the dense MLP layers and of the shared expert (one name covers both, as PEFT matches module-name
// suffixes), the routed experts' fused up_proj / down_proj stacks (target_parameters: mixer.experts.up_proj [E, I, H]
// is a parameter in Transformers v5, so PEFT's target_modules up_proj / down_proj reach the nn.Linear ones only) and
// the router trained in full. Unlike qwen3_moe and deepseek_v3, nemotron_h has its own conversion pattern, which PEFT's
// v4 -> v5 target rewriting does not list, so up_proj / down_proj stay target_modules.
std::vector<LoraTargetDef> lora_targets(const DecoderSpec&) {
  using W = WeightSlot;
  return {{"q_proj", {W::q_proj}},
          {"k_proj", {W::k_proj}},
          {"v_proj", {W::v_proj}},
          {"o_proj", {W::o_proj}},
          {"in_proj", {W::mamba_in_proj}},
          {"out_proj", {W::mamba_out_proj}, false, false, false,
           "PEFT refuses LoRA on the Mamba2 mixer's out_proj (and conv1d) of nemotron_h models, so such an adapter "
           "would not load there; adapt in_proj, the attention projections, up_proj / down_proj or experts"},
          {"up_proj", {W::mlp_up, W::shared_up}},
          {"down_proj", {W::mlp_down, W::shared_down}},
          {"experts", {W::experts_gate_up, W::experts_down}},
          {"router", {W::router}, true}};
}

// NVIDIA-Nemotron-3-Nano-30B-A3B's shapes (hf-numerics.md §6.1: 52 layers = 23 Mamba2 + 23 MoE + 6 attention) in
// the hub's spellings; fields not listed there take NemotronHConfig's defaults.
json nemotron_3_nano_config() {
  return {
      {"architectures", {kNemotronH}},
      {"model_type", "nemotron_h"},
      {"chunk_size", 128},
      {"conv_kernel", 4},
      {"head_dim", 128},
      {"hidden_size", 2688},
      {"hybrid_override_pattern", "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"},
      {"intermediate_size", 1856},
      {"layer_norm_epsilon", 1e-5},
      {"mamba_head_dim", 64},
      {"mamba_hidden_act", "silu"},
      {"mamba_num_heads", 64},
      {"mlp_hidden_act", "relu2"},
      {"moe_intermediate_size", 1856},
      {"moe_shared_expert_intermediate_size", 3712},
      {"n_group", 1},
      {"n_groups", 8},
      {"n_routed_experts", 128},
      {"n_shared_experts", 1},
      {"norm_eps", 1e-5},
      {"norm_topk_prob", true},
      {"num_attention_heads", 32},
      {"num_experts_per_tok", 6},
      {"num_key_value_heads", 2},
      {"residual_in_fp32", false},
      {"rope_theta", 10000},
      {"routed_scaling_factor", 2.5},
      {"ssm_state_size", 128},
      {"tie_word_embeddings", false},
      {"time_step_floor", 1e-4},
      {"time_step_max", 0.1},
      {"time_step_min", 0.001},
      {"topk_group", 1},
      {"torch_dtype", "bfloat16"},
      {"use_bias", false},
      {"use_conv_bias", true},
      {"vocab_size", 131072},
  };
}

}  // namespace

std::vector<ArchitectureInfo> nemotron_h_architectures() {
  return {{kNemotronH, "nemotron_h",
           "Nemotron-H hybrid decoder (per layer one of: Mamba2 mixer, sigmoid-routed ReLU² experts with a shared "
           "expert, attention without positional encoding, ReLU² MLP)",
           &parse_nemotron_h, &to_json, &param_table, &hf_layout, &lora_targets}};
}

std::vector<PresetInfo> nemotron_h_presets() {
  return {{"nemotron-3-nano-30b-a3b",
           "NVIDIA Nemotron 3 Nano 30B-A3B shapes: 52 layers (23 Mamba2, 23 MoE, 6 attention), hidden 2688, 128 "
           "experts top-6 + 1 shared, vocab 131072",
           &nemotron_3_nano_config}};
}

}  // namespace mt
