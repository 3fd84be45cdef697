// Shared by the expert-bias trainer tests (CPU: expert_bias_trainer_test.cpp; GPU: cuda/expert_bias_cuda_trainer_test.cpp):
// a DeepSeek-V3 model made skewed (its selection bias +1 on experts 0 and 1, which then take every token: max/mean
// load E/k), and pre-tokenized data.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fixture_tensors.h"
#include "models/causal_lm.h"
#include "models/presets.h"

namespace mt::test {

// Sets every MoE layer's e_score_correction_bias to +skew on experts 0 and 1, 0 elsewhere (skew larger than the spread
// of the sigmoid scores: those two experts then take every token).
inline void skew_selection_bias(CausalLM& lm, float skew = 1.0f) {
  for (LayerWeights& L : lm.weights.layers) {
    Tensor& b = L.router_score_bias;
    if (!b.defined()) continue;
    for (int64_t e = 0; e < b.numel(); ++e) b.data_as<float>()[e] = e < 2 ? skew : 0.0f;
  }
}

// `examples` pre-tokenized lines of 12..35 ids in [3, vocab), from a fixed LCG.
inline void write_random_token_data(const std::string& path, int64_t vocab, int examples = 64) {
  std::ofstream out(path);
  uint64_t s = 2024;
  auto next = [&] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return s >> 33;
  };
  for (int e = 0; e < examples; ++e) {
    const int len = 12 + static_cast<int>(next() % 24);
    nlohmann::json ids = nlohmann::json::array();
    for (int i = 0; i < len; ++i) ids.push_back(3 + static_cast<int64_t>(next() % static_cast<uint64_t>(vocab - 3)));
    out << nlohmann::json{{"input_ids", ids}, {"labels", ids}}.dump() << "\n";
  }
}

// DeepSeek-V3 at the shapes the GPU kernels take (MLA heads 192 / 128, sizes multiples of 8), 2 layers (the first
// dense), 8 experts in 4 groups keep 2, top-2, one shared expert.
inline nlohmann::json small_deepseek_v3() {
  nlohmann::json j = preset_config_json("deepseek-v3");
  j["vocab_size"] = 512;
  j["hidden_size"] = 128;
  j["intermediate_size"] = 256;
  j["moe_intermediate_size"] = 64;
  j["num_hidden_layers"] = 2;
  j["first_k_dense_replace"] = 1;
  j["num_attention_heads"] = 2;
  j["num_key_value_heads"] = 2;
  j["q_lora_rank"] = 64;
  j["kv_lora_rank"] = 64;
  j["n_routed_experts"] = 8;
  j["n_group"] = 4;
  j["topk_group"] = 2;
  j["num_experts_per_tok"] = 2;
  j["n_shared_experts"] = 1;
  j["initializer_range"] = 0.3;  // the sigmoid scores spread enough that a step of γ moves a few tokens, not all
  j["eos_token_id"] = 2;
  j["pad_token_id"] = 0;
  j["dtype"] = "float32";
  j.erase("torch_dtype");
  return j;
}

// One tensor of a saved model directory: sharded (an index) or one model.safetensors (a bf16 save).
inline Tensor saved_tensor(const std::string& dir, const std::string& name) {
  if (std::filesystem::exists(dir + "/model.safetensors.index.json")) return fixture_checkpoint_read(dir).tensors.at(name);
  return fixture_tensors_read(dir + "/model.safetensors").at(name);
}

}  // namespace mt::test
