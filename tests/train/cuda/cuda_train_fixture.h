// The CUDA training tests' model and data: a small MoE (head_dim 64 for the flash-attention kernels,
// 8 experts), or a dense Qwen3 of the same attention (intermediate_size 256), or a GPT-OSS of the same size (biases,
// sinks, a 16-token window on every other layer, YaRN, the clamped experts), or a DeepSeek-V3 (MLA, the sigmoid group
// router, a shared expert), saved as an F32 checkpoint; 64
// pre-tokenized examples with a learnable pattern (each sequence counts up from a random start), a recipe writer and
// the metrics reader.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../io/io_test_util.h"
#include "../train_test_util.h"
#include "models/causal_lm.h"
#include "models/presets.h"
#include "train/recipe.h"

namespace mt {

enum class TrainModel { qwen3_moe, dense_qwen3, gpt_oss, deepseek_v3 };

inline nlohmann::json gpt_oss_train_config() {
  nlohmann::json j = preset_config_json("gpt-oss-20b");
  j["vocab_size"] = 512;
  j["hidden_size"] = 128;
  j["intermediate_size"] = 64;
  j["head_dim"] = 64;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["num_hidden_layers"] = 2;
  j["num_local_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["experts_per_token"] = 2;
  j["layer_types"] = {"sliding_attention", "full_attention"};
  j["sliding_window"] = 16;
  j["output_router_logits"] = true;
  j["router_aux_loss_coef"] = 0.01;
  j["initializer_range"] = 0.05;
  j["eos_token_id"] = 2;
  j["pad_token_id"] = 0;
  j["dtype"] = "float32";
  return j;
}

// DeepSeek-V3 of the same size: MLA at DeepSeek-V3's head sizes (qk 128 + 64, v 128; q and kv LoRA ranks 64),
// interleaved YaRN, layer 0 dense, layer 1 8 experts in 4 groups (keep 2), top-2 × 2.5 with a shared expert.
inline nlohmann::json deepseek_v3_train_config() {
  nlohmann::json j = preset_config_json("deepseek-v3");
  j["vocab_size"] = 512;
  j["hidden_size"] = 128;
  j["intermediate_size"] = 128;
  j["moe_intermediate_size"] = 64;
  j["num_hidden_layers"] = 2;
  j["first_k_dense_replace"] = 1;
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["n_group"] = 4;
  j["topk_group"] = 2;
  j["n_shared_experts"] = 1;
  j["num_attention_heads"] = 2;
  j["num_key_value_heads"] = 2;
  j["q_lora_rank"] = 64;
  j["kv_lora_rank"] = 64;
  j["initializer_range"] = 0.05;
  j["max_position_embeddings"] = 4096;
  j["eos_token_id"] = 2;
  j["pad_token_id"] = 0;
  j["torch_dtype"] = "float32";
  return j;
}

inline void write_model_and_data(const io_test::ScratchDir& dir, TrainModel kind = TrainModel::qwen3_moe) {
  const bool dense = kind == TrainModel::dense_qwen3;
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["hidden_size"] = 128;
  j["head_dim"] = 64;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["moe_intermediate_size"] = 64;
  j["output_router_logits"] = true;
  j["router_aux_loss_coef"] = 0.01;
  j["initializer_range"] = 0.05;
  if (dense) {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
    j["intermediate_size"] = 256;
    for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                          "mlp_only_layers", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef"})
      j.erase(k);
  }
  if (kind == TrainModel::gpt_oss) j = gpt_oss_train_config();
  if (kind == TrainModel::deepseek_v3) j = deepseek_v3_train_config();
  CausalLM lm = CausalLM::from_config(DecoderSpec::from_json(j, "test"), DType::F32, 3);
  lm.save_pretrained(dir.file("model"));
  std::ofstream out(dir.file("train.jsonl"));
  uint64_t s = 99;
  for (int e = 0; e < 64; ++e) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const int start = static_cast<int>((s >> 33) % 400), len = 20 + static_cast<int>((s >> 20) % 40);
    nlohmann::json ids = nlohmann::json::array();
    for (int i = 0; i < len; ++i) ids.push_back(start + i);
    out << nlohmann::json{{"input_ids", ids}, {"labels", ids}}.dump() << "\n";
  }
}

// Writes <run>.yaml (50 steps of micro-batch 2, grad_accum 2, on the CPU unless overridden) and returns its path.
inline std::string write_recipe(const io_test::ScratchDir& dir, const std::string& run) {
  const std::string path = dir.file(run + ".yaml");
  std::ofstream(path) << "model: {path: " << dir.file("model") << ", dtype: float32}\n"
                      << "data: {train: " << dir.file("train.jsonl") << ", seq_len: 64, pack: true}\n"
                      << "train: {micro_batch_size: 2, grad_accum: 2, max_steps: 50, seed: 5, device: cpu}\n"
                      << "optimizer: {lr: 2.0e-3, betas: [0.9, 0.95], weight_decay: 0.01}\n"
                      << "schedule: {name: cosine, warmup_steps: 5}\n"
                      << "clip: {max_grad_norm: 1.0}\n"
                      << "checkpoint: {dir: " << dir.file(run) << "}\n"
                      << "parallel: {timeout_s: 120}\n";
  return path;
}

inline Recipe recipe(const io_test::ScratchDir& dir, const std::string& run, const std::vector<std::string>& sets) {
  return recipe_load(write_recipe(dir, run), sets);
}

using test::metrics_of;

inline std::vector<double> losses_of(const std::filesystem::path& run) {
  std::vector<double> out;
  for (const auto& m : metrics_of(run)) out.push_back(m["loss"].get<double>());
  return out;
}

}  // namespace mt
