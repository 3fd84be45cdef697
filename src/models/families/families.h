// The family files' entry points: each returns its registry rows (models/registry.h) and its presets
// (models/presets.h). A new family adds one line here and one in registry.cpp / presets.cpp.
#pragma once
#include <vector>

#include "models/presets.h"
#include "models/registry.h"

namespace mt {

std::vector<ArchitectureInfo> qwen3_architectures();  // families/qwen3.cpp
std::vector<PresetInfo> qwen3_presets();
// The Qwen3 / Qwen3-MoE checkpoint layout (the rows' hf_layout), for tests that pair it with their own parameters.
HfLayout qwen3_hf_layout(bool moe, bool tied_embeddings);

std::vector<ArchitectureInfo> gpt_oss_architectures();  // families/gpt_oss.cpp
std::vector<PresetInfo> gpt_oss_presets();
HfLayout gpt_oss_hf_layout();

std::vector<ArchitectureInfo> deepseek_v3_architectures();  // families/deepseek_v3.cpp
std::vector<PresetInfo> deepseek_v3_presets();

std::vector<ArchitectureInfo> nemotron_h_architectures();  // families/nemotron_h.cpp
std::vector<PresetInfo> nemotron_h_presets();

}  // namespace mt
