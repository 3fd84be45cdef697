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

namespace mt::test {

// Sets every MoE layer's e_score_correction_bias to +1 on experts 0 and 1, 0 elsewhere.
inline void skew_selection_bias(CausalLM& lm) {
  for (LayerWeights& L : lm.weights.layers) {
    Tensor& b = L.router_score_bias;
    if (!b.defined()) continue;
    for (int64_t e = 0; e < b.numel(); ++e) b.data_as<float>()[e] = e < 2 ? 1.0f : 0.0f;
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

// One tensor of a saved model directory: sharded (an index) or one model.safetensors (a bf16 save).
inline Tensor saved_tensor(const std::string& dir, const std::string& name) {
  if (std::filesystem::exists(dir + "/model.safetensors.index.json")) return fixture_checkpoint_read(dir).tensors.at(name);
  return fixture_tensors_read(dir + "/model.safetensors").at(name);
}

}  // namespace mt::test
