#include "distributed/ep_dispatch_mode.h"

#include "core/error.h"

namespace mt {

EpDispatchMode ep_dispatch_mode_parse(const std::string& name, int64_t ep, int64_t top_k, const std::string& what) {
  if (name == "auto") return ep <= top_k ? EpDispatchMode::all_gather : EpDispatchMode::all_to_all;
  if (name == "all_gather") return EpDispatchMode::all_gather;
  if (name == "all_to_all") return EpDispatchMode::all_to_all;
  fail("{}: '{}' is not a dispatch mode (auto, all_gather, all_to_all)", what, name);
}

const char* ep_dispatch_mode_name(EpDispatchMode m) {
  return m == EpDispatchMode::all_gather ? "all_gather" : "all_to_all";
}

}  // namespace mt
