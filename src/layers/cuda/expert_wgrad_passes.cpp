#include "layers/cuda/expert_wgrad_passes.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/grouped_gemm.h"

namespace mt {

void ExpertWgradPasses::overwrite_next(Tensor& dw) {
  const bool marked =
      std::any_of(fresh_.begin(), fresh_.end(), [&](const Tensor* t) { return t->data() == dw.data(); });
  if (!marked) fresh_.push_back(&dw);
}

bool ExpertWgradPasses::accumulate_into(const Tensor& dw) {
  const auto it = std::find_if(fresh_.begin(), fresh_.end(), [&](const Tensor* t) { return t->data() == dw.data(); });
  if (it == fresh_.end()) return true;
  fresh_.erase(it);
  return false;
}

void ExpertWgradPasses::add(int64_t layer, Which which, const Tensor& dy, const Tensor& x, const Tensor& offsets,
                            Tensor& dw, cudaStream_t stream) {
  if (!pair_) {
    cuda::grouped_gemm_wgrad(dy, x, offsets, dw, accumulate_into(dw), stream);
    return;
  }
  MT_CHECK(layer >= 0 && layer < static_cast<int64_t>(held_.size()), "expert wgrad pairing: layer {} of {}", layer,
           held_.size());
  Held& h = held_[static_cast<size_t>(layer)][which];
  if (!h.dw) {
    h = {dy, x, offsets, &dw};  // the references keep the buffers out of the allocator until the pass runs
    return;
  }
  MT_CHECK(h.dw == &dw, "expert wgrad pairing: layer {} pairs two different gradient tensors", layer);
  cuda::grouped_gemm_wgrad2(h.dy, h.x, h.offsets, dy, x, offsets, dw, accumulate_into(dw), stream);
  h = {};
}

void ExpertWgradPasses::flush(cudaStream_t stream) {
  for (auto& layer : held_)
    for (Held& h : layer)
      if (h.dw) {
        cuda::grouped_gemm_wgrad(h.dy, h.x, h.offsets, *h.dw, accumulate_into(*h.dw), stream);
        h = {};
      }
  for (Tensor* t : fresh_) cuda::fill_zero_async(*t, stream);  // no pass wrote it this step
  fresh_.clear();
}

bool ExpertWgradPasses::empty() const {
  for (const auto& layer : held_)
    for (const Held& h : layer)
      if (h.dw) return false;
  return true;
}

}  // namespace mt
