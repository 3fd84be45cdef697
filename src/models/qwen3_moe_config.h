// config.json of Qwen3MoeForCausalLM and Qwen3ForCausalLM (the dense Qwen3 is the special case
// num_experts = 0: every layer takes the dense MLP). Both the hub spellings and the
// Transformers-v5 spellings are accepted (hf-numerics.md §1.2, §3.1).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mt {

struct Qwen3MoeConfig {
  std::string architecture;  // architectures[0]: "Qwen3MoeForCausalLM" | "Qwen3ForCausalLM"
  std::string model_type;    // "qwen3_moe" | "qwen3"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // per expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;               // missing => hidden_size / num_attention_heads
  int64_t num_experts = 0;            // num_experts | num_local_experts; 0 => dense model
  int64_t num_experts_per_tok = 0;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = false;
  bool tie_word_embeddings = false;
  bool output_router_logits = false;
  bool attention_bias = false;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;        // rope_parameters.rope_theta | rope_theta
  double router_aux_loss_coef = 0.001;
  double initializer_range = 0.02;
  int64_t max_position_embeddings = 32768;
  DType dtype = DType::F32;           // dtype | torch_dtype; the storage dtype of the checkpoint

  nlohmann::json raw;  // the file as read, carried through to saved checkpoints

  bool is_moe() const { return num_experts > 0; }
  // HF: MoE iff i not in mlp_only_layers, num_experts > 0 and (i + 1) % decoder_sparse_step == 0.
  bool is_moe_layer(int64_t layer) const;

  // Parses and validates; every error names `file` and the field. Throws mt::Error.
  static Qwen3MoeConfig from_json(const nlohmann::json& j, const std::string& file);
  static Qwen3MoeConfig from_file(const std::string& path);
  // The config.json to save: `raw` with the fields this struct owns updated (dtype in v5 spelling).
  nlohmann::json to_json() const;
};

}  // namespace mt
