// How expert parallelism brings tokens to the ranks that hold their experts (the CUDA engine's two
// dispatches, layers/cuda/expert_parallel_cuda.h; recipe key parallel.ep_dispatch, bench --ep-dispatch).
//   all_gather  each token once per rank of the group (all-gather), partial sums back by reduce-scatter:
//               (ep-1)·T rows each way per rank, fixed message sizes
//   all_to_all  each routed slot to its expert's rank and back: T·k·(ep-1)/ep rows each way per rank
// The all-gather moves no more rows while ep <= top-k, which is what `auto` picks.
#pragma once
#include <cstdint>
#include <string>

namespace mt {

enum class EpDispatchMode { all_gather, all_to_all };

// "auto", "all_gather" or "all_to_all"; anything else fails naming `what` (the setting).
EpDispatchMode ep_dispatch_mode_parse(const std::string& name, int64_t ep, int64_t top_k, const std::string& what);
const char* ep_dispatch_mode_name(EpDispatchMode m);

}  // namespace mt
