#include "kernels/cuda/moe_permute.h"

#include "core/error.h"
#include "kernels/cuda/device_tensor_check.h"
#include "kernels/cuda/moe_permute_kernels.h"

namespace mt::cuda {

namespace {

void check_plan(const MoePlan& p, const Tensor& like) {
  const int64_t N = p.tokens * p.top_k;
  check_device_tensor(p.offsets, "moe plan offsets", DType::I32, {p.experts + 1});
  check_device_tensor(p.row_of_slot, "moe plan row_of_slot", DType::I32, {N});
  check_device_tensor(p.slot_of_row, "moe plan slot_of_row", DType::I32, {N});
  check_same_device(p.offsets, like, "moe plan");
}

}  // namespace

MoePlan moe_plan(const Tensor& index, int64_t experts, cudaStream_t stream) {
  MT_CHECK(index.defined() && index.ndim() == 2, "moe plan: index must be [T, k], got {}",
           index.defined() ? index.desc() : "undefined");
  const int64_t T = index.dim(0), k = index.dim(1), N = T * k;
  check_device_tensor(index, "moe plan index", DType::I32, {T, k});
  MT_CHECK(experts >= 1 && experts <= 1024, "moe plan: {} experts (supported 1..1024)", experts);
  MT_CHECK(k >= 1 && k <= 32, "moe plan: top-k {} (supported 1..32)", k);
  MT_CHECK(N < (int64_t{1} << 31), "moe plan: {} slots exceed int32 row ids", N);
  MoePlan p;
  p.tokens = T, p.top_k = k, p.experts = experts;
  p.offsets = Tensor::empty({experts + 1}, DType::I32, index.device());
  p.row_of_slot = Tensor::empty({N}, DType::I32, index.device());
  p.slot_of_row = Tensor::empty({N}, DType::I32, index.device());
  const int64_t chunks = (N + detail::kPlanChunk - 1) / detail::kPlanChunk;
  Tensor scratch = Tensor::empty({std::max<int64_t>(chunks, 1), experts}, DType::I32, index.device());
  detail::moe_plan_launch(index.data_as<int32_t>(), N, static_cast<int>(experts), scratch.data_as<int32_t>(),
                          p.offsets.data_as<int32_t>(), p.row_of_slot.data_as<int32_t>(),
                          p.slot_of_row.data_as<int32_t>(), stream);
  return p;
}

Tensor moe_gather(const Tensor& x, const MoePlan& plan, cudaStream_t stream) {
  MT_CHECK(x.defined() && x.ndim() == 2, "moe gather: x must be [T, H]");
  const int64_t H = x.dim(1), N = plan.tokens * plan.top_k;
  check_device_tensor(x, "moe gather x", DType::BF16, {plan.tokens, H});
  check_plan(plan, x);
  MT_CHECK(H < (int64_t{1} << 31), "moe gather: hidden {}", H);
  Tensor xg = Tensor::empty({N, H}, DType::BF16, x.device());
  detail::moe_gather_launch(x.data(), N, static_cast<int>(H), static_cast<int>(plan.top_k),
                            plan.slot_of_row.data_as<int32_t>(), xg.data(), stream);
  return xg;
}

void moe_combine(const Tensor& y, const Tensor& weights, const MoePlan& plan, Tensor& out, cudaStream_t stream) {
  MT_CHECK(y.defined() && y.ndim() == 2, "moe combine: y must be [T·k, H]");
  const int64_t T = plan.tokens, k = plan.top_k, H = y.dim(1);
  check_device_tensor(y, "moe combine y", DType::BF16, {T * k, H});
  if (weights.defined()) check_device_tensor(weights, "moe combine weights", DType::F32, {T, k});
  check_device_tensor2(out, "moe combine out", DType::BF16, DType::F32, {T, H});
  check_plan(plan, y);
  check_same_device(out, y, "moe combine");
  detail::moe_combine_launch(y.data(), weights.defined() ? weights.data_as<float>() : nullptr,
                             plan.row_of_slot.data_as<int32_t>(), T, static_cast<int>(k), static_cast<int>(H),
                             out.data(), out.dtype() == DType::F32, stream);
}

void moe_combine_backward(const Tensor& dout, const Tensor& y, const Tensor& weights, const MoePlan& plan, Tensor& dy,
                          Tensor& dweights, cudaStream_t stream) {
  MT_CHECK(dout.defined() && dout.ndim() == 2, "moe combine backward: dout must be [T, H]");
  const int64_t T = plan.tokens, k = plan.top_k, H = dout.dim(1);
  check_device_tensor2(dout, "moe combine dout", DType::BF16, DType::F32, {T, H});
  check_device_tensor(dy, "moe combine dy", DType::BF16, {T * k, H});
  if (weights.defined()) {
    check_device_tensor(weights, "moe combine weights", DType::F32, {T, k});
    check_device_tensor(y, "moe combine y", DType::BF16, {T * k, H});
    check_device_tensor(dweights, "moe combine dweights", DType::F32, {T, k});
  }
  check_plan(plan, dout);
  check_same_device(dy, dout, "moe combine backward");
  detail::moe_combine_backward_launch(dout.data(), dout.dtype() == DType::F32, weights.defined() ? y.data() : nullptr,
                                      weights.defined() ? weights.data_as<float>() : nullptr,
                                      plan.row_of_slot.data_as<int32_t>(), T, static_cast<int>(k), static_cast<int>(H),
                                      dy.data(), weights.defined() ? dweights.data_as<float>() : nullptr, stream);
}

void moe_gather_backward(const Tensor& dxg, const MoePlan& plan, Tensor& dx, cudaStream_t stream) {
  moe_combine(dxg, Tensor(), plan, dx, stream);
}

}  // namespace mt::cuda
