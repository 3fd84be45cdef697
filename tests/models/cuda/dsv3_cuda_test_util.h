// Small DeepSeek-V3 configurations for the CUDA tests (the deepseek-v3 preset with its sizes shrunk): multi-head latent
// attention of a chosen head geometry, interleaved YaRN RoPE (factor 40, mscale 1: the softmax scale has mscale²), the
// sigmoid group router and a shared expert.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>

#include "models/presets.h"

namespace mt::test {

struct MlaGeometry {
  int64_t heads = 2, nope = 128, rope = 64, v = 128;  // DeepSeek-V3's head sizes
  int64_t q_lora = 32;                                 // 0: a plain q_proj
  int64_t kv_lora = 32;
  bool interleaved = true;
};

// `layers` layers, the first `dense` of them dense MLPs (first_k_dense_replace), the rest MoE: 8 experts in 4 groups
// (topk_group 2), top-2, renormalised, × 2.5, one shared expert of 2 × 32 (n_shared_experts 2).
inline nlohmann::json dsv3_test_json(const MlaGeometry& g = {}, int64_t layers = 2, int64_t dense = 1) {
  nlohmann::json j = preset_config_json("deepseek-v3");
  j["hidden_size"] = 64;
  j["intermediate_size"] = 96;
  j["moe_intermediate_size"] = 32;
  j["num_hidden_layers"] = layers;
  j["first_k_dense_replace"] = dense;
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["n_group"] = 4;
  j["topk_group"] = 2;
  j["n_shared_experts"] = 2;
  j["num_attention_heads"] = g.heads;
  j["num_key_value_heads"] = g.heads;
  j["qk_nope_head_dim"] = g.nope;
  j["qk_rope_head_dim"] = g.rope;
  j["v_head_dim"] = g.v;
  j["q_lora_rank"] = g.q_lora > 0 ? nlohmann::json(g.q_lora) : nlohmann::json(nullptr);
  j["kv_lora_rank"] = g.kv_lora;
  j["rope_interleave"] = g.interleaved;
  j["vocab_size"] = 256;
  j["initializer_range"] = 0.08;
  j["max_position_embeddings"] = 4096;
  j["torch_dtype"] = "float32";
  j["eos_token_id"] = 1;
  j["pad_token_id"] = 0;
  return j;
}

}  // namespace mt::test
