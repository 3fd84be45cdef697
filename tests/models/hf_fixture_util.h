// Reading the Transformers fixtures (tests/fixtures/qwen3_moe, tools/hf_reference/make_model_fixtures.py):
// meta.json, the batches' safetensors, the one-step AdamW settings. Shared by the CPU and CUDA parity tests.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "models/decoder_model.h"
#include "train/adamw.h"

namespace mt::test {

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// input_ids, labels and (packed batches) position_ids of a fixture batch file.
inline Batch load_batch(const SafetensorsFile& f) {
  Batch b;
  b.input_ids = f.tensor("input_ids").clone();
  b.labels = f.tensor("labels").clone();
  if (f.has("position_ids")) b.position_ids = f.tensor("position_ids").clone();
  return b;
}

// meta.json "adamw_one_step": {lr, betas, eps, weight_decay} as AdamW options.
inline AdamWOptions adamw_options(const nlohmann::json& hp) {
  AdamWOptions o;
  o.lr = hp["lr"];
  o.beta1 = hp["betas"][0];
  o.beta2 = hp["betas"][1];
  o.eps = hp["eps"];
  o.weight_decay = hp["weight_decay"];
  return o;
}

}  // namespace mt::test
