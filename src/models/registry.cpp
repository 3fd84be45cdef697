#include "models/registry.h"

#include "core/error.h"

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
  // Sorted by name so the "supported:" list in errors is stable.
  static const std::vector<ArchitectureInfo> rows = {
      {"Qwen3ForCausalLM", "qwen3", "Qwen3 dense decoder (QK-norm, GQA, SwiGLU MLP)"},
      {"Qwen3MoeForCausalLM", "qwen3_moe", "Qwen3-MoE decoder (Qwen3 attention, top-k routed SwiGLU experts)"},
  };
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

}  // namespace mt
