// The device half of the all-gather expert dispatch's row budget (distributed/ep_row_budget.h): the rows
// routed to this rank's experts stay a device count; the buffers of those rows have a budgeted size, and
// this records how the count compares with it, for the training step to read at its one sync.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/moe_permute.h"

namespace mt::cuda {

// plan: a local plan (moe_plan_local), its live row count n = offsets[live_experts] on the device.
// watch: I32 [2] on the same device; this adds
//   watch[0] = max(watch[0], ceil(n · scale / share))   the load, a fixed-point ratio to the even share
//   watch[1] += (n > capacity)                         the layers whose load passed the budget
// and clamps offsets[0..live_experts] to `capacity`, so that every kernel after it (the gather, the grouped
// GEMMs, the combine and their backward) stays inside buffers of `capacity` rows. A clamped layer drops its
// rows past the budget: its results are wrong, and the step that reads watch[1] must run again.
// share >= 1, scale >= 1, capacity >= 0. Asynchronous on `stream`.
void ep_watch_live_rows(MoePlan& plan, int64_t capacity, int64_t share, int64_t scale, Tensor& watch,
                        cudaStream_t stream);

namespace detail {
// The raw launcher (ep_row_watch.cu), after the checks.
void ep_watch_launch(int32_t* offsets, int live, int32_t capacity, int64_t share, int64_t scale, int32_t* watch,
                     cudaStream_t stream);
}  // namespace detail

}  // namespace mt::cuda
