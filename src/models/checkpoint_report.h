// What a checkpoint is and what training it costs, as data: `mixtune inspect` prints it (as a table or JSON) and the
// library's Model::inspect returns it. Reads config.json and the shards' headers only.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/spec/decoder_spec.h"

namespace mt {

// LoRA on the model (inspect --lora-target): the adapter's size and the training state with the base frozen.
struct ReportLora {
  int64_t r = 16;
  double alpha = 32;
  std::vector<std::string> target;  // empty: no "lora" entry
};

struct CheckpointReport {
  std::string dir;      // the resolved checkpoint directory
  DecoderSpec spec;     // config.json
  nlohmann::json json;  // `mixtune inspect --json`'s object
};

// path: a checkpoint directory or Org/Name in the local HF cache. mt::Error (one line) for what cannot be read.
CheckpointReport checkpoint_report(const std::string& path, const ReportLora& lora = {});

// The layers using each configuration of `kind` (spec index -> layers), for configurations some layer uses.
std::map<int, std::vector<int64_t>> layers_by_config(const DecoderSpec& c, SublayerKind kind);

}  // namespace mt
