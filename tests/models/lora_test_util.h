// Shared by the LoRA tests: tiny Qwen3-MoE (a dense layer among MoE ones) and GPT-OSS specs, adapter configs and
// random adapters (B != 0, so an adapter that is not applied, or applied in the wrong layout, changes results).
#pragma once
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/decoder_model.h"
#include "models/lora_adapter.h"
#include "models/registry.h"
#include "models/spec/decoder_spec.h"

namespace mt::test {

inline DecoderSpec qwen_spec() {
  const nlohmann::json j = {
      {"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"vocab_size", 23},
      {"hidden_size", 12}, {"intermediate_size", 10}, {"moe_intermediate_size", 5}, {"num_hidden_layers", 3},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 6}, {"num_experts", 4},
      {"num_experts_per_tok", 2}, {"mlp_only_layers", {1}}, {"norm_topk_prob", true}, {"tie_word_embeddings", false},
      {"output_router_logits", true}, {"router_aux_loss_coef", 0.1}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0},
      {"initializer_range", 0.4}};
  return DecoderSpec::from_json(j, "qwen_spec");
}

inline DecoderSpec gpt_oss_spec() {
  return DecoderSpec::from_file(
      (std::filesystem::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/gpt_oss/yarn_window_aux/ckpt/config.json").string());
}

inline Batch batch_of(const DecoderSpec& s) {
  const int64_t B = 2, S = 7;
  Batch b;
  b.input_ids = Tensor::empty({B, S}, DType::I64);
  b.labels = Tensor::empty({B, S}, DType::I64);
  std::mt19937_64 g(5);
  for (int64_t i = 0; i < B * S; ++i) {
    b.input_ids.data_as<int64_t>()[i] = static_cast<int64_t>(g() % static_cast<uint64_t>(s.vocab_size));
    b.labels.data_as<int64_t>()[i] = i % 5 == 0 ? -100 : static_cast<int64_t>(g() % static_cast<uint64_t>(s.vocab_size));
  }
  return b;
}

inline LoraConfig config_of(std::vector<std::string> target, int64_t r = 3) {
  LoraConfig c;
  c.r = r;
  c.alpha = 5;
  c.target = std::move(target);
  return c;
}

// Random A and B (B too, so the adapter changes the model).
inline LoraWeights random_adapter(std::shared_ptr<const LoraTable> t, int64_t layers, uint64_t seed) {
  LoraWeights l = LoraWeights::zeros(std::move(t), layers);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (auto& [name, p] : l.named_parameters())
    for (int64_t i = 0; i < p->numel(); ++i) p->data_as<float>()[i] = d(g);
  return l;
}

inline DecoderSpec deepseek_v3_spec(const char* variant) {
  const std::filesystem::path dir = std::filesystem::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/deepseek_v3" / variant;
  return DecoderSpec::from_file((dir / "ckpt/config.json").string());
}

// Every target name of the family that matches a parameter of `s` (DeepSeek-V3 has q_proj or the q LoRA pair), but
// the refused ones (Nemotron-H's out_proj).
inline std::vector<std::string> all_targets(const DecoderSpec& s) {
  const ParamTable table = param_table_of(s);
  std::vector<std::string> t;
  for (const LoraTargetDef& d : lora_targets_of(s)) {
    if (!d.refused.empty()) continue;
    bool matches = false;
    for (const ParamEntry& e : table.entries())
      for (int slot : d.slots) matches = matches || (e.layer >= 0 && e.slot == slot);
    if (matches) t.push_back(d.name);
  }
  return t;
}

}  // namespace mt::test
