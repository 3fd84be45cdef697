#include "kernels/cuda/ep_row_watch.h"

#include <climits>

#include "core/error.h"
#include "kernels/cuda/device_tensor_check.h"

namespace mt::cuda {

void ep_watch_live_rows(MoePlan& plan, int64_t capacity, int64_t share, int64_t scale, Tensor& watch,
                        cudaStream_t stream) {
  MT_CHECK(plan.local(), "expert row watch: needs a local plan (moe_plan_local)");
  check_device_tensor(plan.offsets, "expert row watch offsets", DType::I32, {plan.experts + 1});
  check_device_tensor(watch, "expert row watch", DType::I32, {2});
  check_same_device(plan.offsets, watch, "expert row watch");
  MT_CHECK(share >= 1 && scale >= 1 && capacity >= 0 && capacity <= INT32_MAX,
           "expert row watch: share {}, scale {}, capacity {}", share, scale, capacity);
  detail::ep_watch_launch(plan.offsets.data_as<int32_t>(), static_cast<int>(plan.live_experts),
                          static_cast<int32_t>(capacity), share, scale, watch.data_as<int32_t>(), stream);
}

}  // namespace mt::cuda
