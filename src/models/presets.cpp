#include "models/presets.h"

#include "core/error.h"

namespace mt {

namespace {
using json = nlohmann::json;

json qwen3_moe_base() {
  return {
      {"architectures", {"Qwen3MoeForCausalLM"}},
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

json make(std::initializer_list<std::pair<const char*, json>> overrides) {
  json j = qwen3_moe_base();
  for (const auto& [k, v] : overrides) j[k] = v;
  return j;
}
}  // namespace

const std::vector<PresetInfo>& preset_list() {
  static const std::vector<PresetInfo> list = {
      {"qwen3-30b-a3b", "Qwen3-30B-A3B shapes: 48 layers, hidden 2048, 128 experts top-8, vocab 151936"},
      {"qwen3-moe-tiny", "quickstart size: 4 layers, hidden 128, 8 experts top-2, Qwen3 vocabulary (151936)"},
      {"qwen3-moe-test", "test size: 2 layers, hidden 64, 8 experts top-2, vocab 512"},
  };
  return list;
}

json preset_config_json(const std::string& name) {
  if (name == "qwen3-30b-a3b")
    return make({{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 6144},
                 {"moe_intermediate_size", 768}, {"num_hidden_layers", 48}, {"num_attention_heads", 32},
                 {"num_key_value_heads", 4}, {"head_dim", 128}, {"num_experts", 128},
                 {"num_experts_per_tok", 8}, {"max_position_embeddings", 40960}, {"tie_word_embeddings", false}});
  if (name == "qwen3-moe-tiny")
    return make({{"vocab_size", 151936}, {"hidden_size", 128}, {"intermediate_size", 384},
                 {"moe_intermediate_size", 128}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                 {"num_key_value_heads", 2}, {"head_dim", 32}, {"num_experts", 8}, {"num_experts_per_tok", 2},
                 {"max_position_embeddings", 4096}, {"tie_word_embeddings", true}});
  if (name == "qwen3-moe-test")
    return make({{"vocab_size", 512}, {"hidden_size", 64}, {"intermediate_size", 128},
                 {"moe_intermediate_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                 {"num_key_value_heads", 2}, {"head_dim", 16}, {"num_experts", 8}, {"num_experts_per_tok", 2},
                 {"max_position_embeddings", 1024}, {"tie_word_embeddings", false}, {"initializer_range", 0.1},
                 {"bos_token_id", 1}, {"eos_token_id", 2}, {"dtype", "float32"}});
  std::string names;
  for (const auto& p : preset_list()) names += (names.empty() ? "" : ", ") + p.name;
  fail("unknown preset '{}' (available: {})", name, names);
}

}  // namespace mt
