#include "layers/cuda/expert_wgrad_pairing.h"

#include "core/error.h"
#include "kernels/cuda/grouped_gemm.h"

namespace mt {

void ExpertWgradPairing::add(int64_t layer, Which which, const Tensor& dy, const Tensor& x, const Tensor& offsets,
                             Tensor& dw, cudaStream_t stream) {
  MT_CHECK(layer >= 0 && layer < static_cast<int64_t>(held_.size()), "expert wgrad pairing: layer {} of {}", layer,
           held_.size());
  Held& h = held_[static_cast<size_t>(layer)][which];
  if (!h.dw) {
    h = {dy, x, offsets, &dw};  // the references keep the buffers out of the allocator until the pass runs
    return;
  }
  MT_CHECK(h.dw == &dw, "expert wgrad pairing: layer {} pairs two different gradient tensors", layer);
  cuda::grouped_gemm_wgrad2(h.dy, h.x, h.offsets, dy, x, offsets, dw, /*accumulate=*/true, stream);
  h = {};
}

void ExpertWgradPairing::flush(cudaStream_t stream) {
  for (auto& layer : held_)
    for (Held& h : layer)
      if (h.dw) {
        cuda::grouped_gemm_wgrad(h.dy, h.x, h.offsets, *h.dw, /*accumulate=*/true, stream);
        h = {};
      }
}

bool ExpertWgradPairing::empty() const {
  for (const auto& layer : held_)
    for (const Held& h : layer)
      if (h.dw) return false;
  return true;
}

}  // namespace mt
