#include "models/registry.h"

#include <algorithm>

#include "core/error.h"
#include "models/families/families.h"

namespace mt {

namespace {
// The name comes from a file we do not trust: keep the one-line error short and printable.
std::string name_printable(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (r.size() >= 80) return r + "...";
    r += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return r;
}
}  // namespace

const std::vector<ArchitectureInfo>& architecture_list() {
  static const std::vector<ArchitectureInfo> rows = [] {
    std::vector<ArchitectureInfo> r;
    for (auto* family :
         {&qwen3_architectures, &gpt_oss_architectures, &deepseek_v3_architectures, &nemotron_h_architectures}) {
      std::vector<ArchitectureInfo> f = family();
      r.insert(r.end(), f.begin(), f.end());
    }
    // Sorted by name so the "supported:" list in errors is stable.
    std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return r;
  }();
  return rows;
}

const ArchitectureInfo& architecture_lookup(const std::string& arch, const std::string& file) {
  std::string names;
  for (const ArchitectureInfo& a : architecture_list()) {
    if (a.name == arch) return a;
    names += (names.empty() ? "" : ", ") + a.name;
  }
  fail("{}: architecture '{}' is not supported (supported: {})", file, name_printable(arch), names);
}

ParamTable param_table_of(const DecoderSpec& s) {
  return architecture_lookup(s.architecture, "parameter table").param_table(s);
}

HfLayout hf_layout_of(const DecoderSpec& s) {
  return architecture_lookup(s.architecture, "checkpoint layout").hf_layout(s);
}

std::vector<LoraTargetDef> lora_targets_of(const DecoderSpec& s) {
  return architecture_lookup(s.architecture, "LoRA targets").lora_targets(s);
}

}  // namespace mt
