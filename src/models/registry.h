// Which architectures (config.json `architectures[0]`) mixtune can train: one row per architecture, each
// pointing at its family file's functions (src/models/families/). Adding a family = its file + its rows in
// families.h; nothing else tests an architecture's name.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "models/param_table.h"
#include "models/registry.h"
#include "models/spec/decoder_spec.h"
#include "models/spec/hf_rules.h"
#include "models/spec/lora_targets.h"

namespace mt {

struct FieldReader;  // models/spec/config_reader.h

struct ArchitectureInfo {
  std::string name;         // "Qwen3MoeForCausalLM", as in config.json `architectures`
  std::string model_type;   // config.json `model_type`: "qwen3_moe"
  std::string description;  // one line for `mixtune --help` and error messages
  // config.json -> spec (model-level and per-layer parts); architecture, model_type and raw are set by the
  // caller (DecoderSpec::from_json), which has checked architectures[0] and model_type.
  DecoderSpec (*parse)(const FieldReader& r) = nullptr;
  // spec -> config.json to save (raw with the owned fields written back in v5 spellings).
  nlohmann::json (*to_json)(const DecoderSpec& s) = nullptr;
  // Every tensor of the model, in Transformers' named_parameters() order, with its HF in-memory name.
  ParamTable (*param_table)(const DecoderSpec& s) = nullptr;
  // The checkpoint layout as rules over the parameter table's names (models/spec/hf_rules.h): how the stored
  // tensors make the parameters on load and are written back on save, and the order save_pretrained writes.
  HfLayout (*hf_layout)(const DecoderSpec& s) = nullptr;
  // The names `peft.target` may list for this family (models/spec/lora_targets.h).
  std::vector<LoraTargetDef> (*lora_targets)(const DecoderSpec& s) = nullptr;
};

// Throws mt::Error "<file>: architecture 'X' is not supported (supported: A, B)".
const ArchitectureInfo& architecture_lookup(const std::string& arch, const std::string& file);
const std::vector<ArchitectureInfo>& architecture_list();

// The parameter table of a spec, by its architecture's row.
ParamTable param_table_of(const DecoderSpec& s);
// The checkpoint layout of a spec, by its architecture's row.
HfLayout hf_layout_of(const DecoderSpec& s);
// The LoRA target names of a spec's family, by its architecture's row.
std::vector<LoraTargetDef> lora_targets_of(const DecoderSpec& s);

}  // namespace mt
