// Shared by the CUDA Nemotron-H tests (nemotron_h_cuda_model_test.cpp, lora_cuda_model_test.cpp): the hybrid
// M E M * E - layout of tests/fixtures/nemotron_h/hybrid_all_kinds at sizes the GEMMs take (hidden 64, 8 Mamba2 heads
// of 16 in 2 groups of state 16: in_proj 128 + 192 + 8 = 328 wide, chunk 16; NoPE attention 4 / 2 heads of 32; 8
// ReLU² experts top-2 with the sigmoid router, its correction bias and a ReLU² shared expert; a ReLU² dense MLP), and
// random BF16 weights with every per-head path exercised.
#pragma once
#include <cstdint>

#include "../../kernels/cuda/cuda_test_util.h"
#include "cuda_model_test_util.h"
#include "models/model_weights.h"
#include "models/presets.h"
#include "models/spec/decoder_spec.h"

namespace mt::test {

inline nlohmann::json nemotron_test_json() {
  nlohmann::json j = preset_config_json("nemotron-3-nano-30b-a3b");
  j.erase("hybrid_override_pattern");
  j["layers_block_type"] = {"mamba", "moe", "mamba", "attention", "moe", "mlp"};
  j["hidden_size"] = 64;
  j["mamba_num_heads"] = 8;
  j["mamba_head_dim"] = 16;
  j["n_groups"] = 2;
  j["ssm_state_size"] = 16;
  j["chunk_size"] = 16;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 32;
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  j["moe_shared_expert_intermediate_size"] = 48;
  j["intermediate_size"] = 96;
  j["vocab_size"] = 256;
  j["initializer_range"] = 0.08;
  j["torch_dtype"] = "float32";
  j["eos_token_id"] = 1;
  j["pad_token_id"] = 0;
  return j;
}

inline DecoderSpec nemotron_test_spec() { return DecoderSpec::from_json(nemotron_test_json(), "nemotron-h test"); }

// Random correction biases and Mamba2 scalars away from their inits (zeros; A_log = log(1..heads), D = 1), so the
// selection bias and every per-head path are exercised.
inline ModelWeights nemotron_random_weights(const DecoderSpec& cfg, uint64_t seed) {
  ModelWeights w = ModelWeights::random_init(cfg, DType::BF16, seed);
  randomise_correction_bias(w, seed + 100);
  for (LayerWeights& L : w.layers) {
    if (L.mamba_d.defined()) L.mamba_d = host_random(L.mamba_d.shape(), seed++, 1.0f, true).to(DType::BF16);
  }
  return w;
}

}  // namespace mt::test
