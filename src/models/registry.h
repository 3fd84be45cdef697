// Which architectures (config.json `architectures[0]`) mixtune can train. One row per
// architecture: adding DeepSeek-V3, GPT-OSS or Nemotron-H is a new row in registry.cpp.
#pragma once
#include <string>
#include <vector>

namespace mt {

struct ArchitectureInfo {
  std::string name;         // "Qwen3MoeForCausalLM", as in config.json `architectures`
  std::string model_type;   // config.json `model_type`: "qwen3_moe"
  std::string description;  // one line for `mixtune --help` and error messages
};

// Throws mt::Error "<file>: architecture 'X' is not supported (supported: A, B)".
const ArchitectureInfo& architecture_lookup(const std::string& arch, const std::string& file);
const std::vector<ArchitectureInfo>& architecture_list();

}  // namespace mt
