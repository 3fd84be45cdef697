// LoRA adapters on disk in Hugging Face PEFT's format (docs/lora.md; the PEFT layout is documented in
// docs/peft-format.md): adapter_config.json + adapter_model.safetensors with PEFT's tensor names, so
// PeftModel.from_pretrained(base, dir) loads them as they are and PEFT-made adapters load here.
//   nn.Linear targets (target_modules): base_model.model.<module>.lora_A.weight [r, in], .lora_B.weight [out, r]
//   expert stacks (target_parameters, PEFT >= 0.19.1's ParamWrapper): <...>.mlp.experts[.base_layer].lora_A.weight
//     [E·r, in] (expert-major rows), lora_B.weight [out, r·E] (column j·E + e = rank j of expert e); gate_up_proj
//     is the inner wrapper (base_layer.), down_proj the outer
//   full-trained targets (the router; PEFT's modules_to_save): base_model.model.<module>.weight|bias, base dtype
// The engines' layout (A [E, r, in], B [E, out, r], gate rows before up rows) is converted here and nowhere else.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"
#include "models/spec/decoder_spec.h"

namespace mt {

// The adapter's tensors under PEFT's names and layouts, in table order (A, B per adapted weight), then the
// full-trained base parameters (from `base`).
std::vector<std::pair<std::string, Tensor>> lora_to_peft(const LoraWeights& lora, const ModelWeights& base);
// adapter_config.json's content for the adapter (fields as PEFT writes them; docs/peft-format.md).
nlohmann::json lora_peft_config(const DecoderSpec& spec, const LoraTable& table, const std::string& base_model);
// Writes adapter_config.json and adapter_model.safetensors into the existing directory `dir`.
void lora_write_files(const std::string& dir, const DecoderSpec& spec, const LoraWeights& lora,
                      const ModelWeights& base, const std::string& base_model);
// The same into `dir`, all or nothing (a temp directory renamed into place).
void lora_save_pretrained(const std::string& dir, const DecoderSpec& spec, const LoraWeights& lora,
                          const ModelWeights& base, const std::string& base_model);

// dir/adapter_config.json as the family's target names (one-line errors naming the file and field for what
// mixtune does not implement: DoRA, lora_bias, bias != none, fan_in_fan_out, rank/alpha patterns, layer selection,
// targets it cannot map, an expert target covering one of the two stacks). lora_dropout is ignored (training only).
LoraConfig lora_config_read(const std::string& dir, const DecoderSpec& spec);
// The adapter in dir for `spec`'s model: every tensor checked (name, shape, F32|BF16; none missing, none extra)
// and converted to the engines' layout (F32). The full-trained base parameters it holds (modules_to_save) are
// copied into `base` (which must hold every expert).
LoraWeights lora_load_pretrained(const std::string& dir, const DecoderSpec& spec, ModelWeights& base);

// Whether dir holds an adapter (adapter_config.json).
bool lora_dir_is_adapter(const std::string& dir);

}  // namespace mt
