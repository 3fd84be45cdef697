#include "kernels/cuda/moe_permute.h"

#include <algorithm>

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
  MT_CHECK(p.live_experts >= 1 && p.live_experts <= p.experts, "moe plan: {} live of {} buckets", p.live_experts,
           p.experts);
}

// The grouped rows y / dy of a plan: every slot's row, or (a local plan) at least the live ones, which the
// host does not know without a device read: any row count (the plan's own row ids bound the accesses).
void check_rows(const Tensor& t, const MoePlan& p, const char* what, int64_t H) {
  if (p.local())
    check_device_tensor(t, what, DType::BF16, {t.defined() && t.ndim() == 2 ? t.dim(0) : -1, H});
  else
    check_device_tensor(t, what, DType::BF16, {p.tokens * p.top_k, H});
}

// The device pointer to the live row count of a local plan, null for a full plan.
const int32_t* row_limit(const MoePlan& p) {
  return p.local() ? p.offsets.data_as<int32_t>() + p.live_experts : nullptr;
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
  p.tokens = T, p.top_k = k, p.experts = experts, p.live_experts = experts;
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

MoePlan moe_plan_local(const Tensor& index, int64_t experts, int64_t first, int64_t count, cudaStream_t stream) {
  MT_CHECK(index.defined() && index.ndim() == 2, "moe local plan: index must be [T, k], got {}",
           index.defined() ? index.desc() : "undefined");
  check_device_tensor(index, "moe local plan index", DType::I32, {index.dim(0), index.dim(1)});
  MT_CHECK(count >= 1 && first >= 0 && first + count <= experts, "moe local plan: experts [{}, {}) of {}", first,
           first + count, experts);
  Tensor local = Tensor::empty(index.shape(), DType::I32, index.device());
  detail::moe_local_ids_launch(index.data_as<int32_t>(), index.numel(), static_cast<int>(first),
                               static_cast<int>(count), local.data_as<int32_t>(), stream);
  MoePlan p = moe_plan(local, count + 1, stream);
  p.live_experts = count;
  return p;
}

namespace {

// Checks shared by the gathers; rows: the output's rows.
void check_gather(const Tensor& x, const MoePlan& plan, const Tensor& xg, int64_t rows) {
  MT_CHECK(x.defined() && x.ndim() == 2, "moe gather: x must be [T, H]");
  const int64_t H = x.dim(1);
  check_device_tensor(x, "moe gather x", DType::BF16, {plan.tokens, H});
  check_plan(plan, x);
  MT_CHECK(H < (int64_t{1} << 31), "moe gather: hidden {}", H);
  check_device_tensor(xg, "moe gather output", DType::BF16, {rows, H});
  check_same_device(x, xg, "moe gather");
}

}  // namespace

void moe_gather_live(const Tensor& x, const MoePlan& plan, Tensor& xg, cudaStream_t stream) {
  MT_CHECK(plan.local(), "moe gather: moe_gather_live needs a local plan");
  MT_CHECK(xg.defined() && xg.ndim() == 2, "moe gather: output must be [R, H]");
  check_gather(x, plan, xg, xg.dim(0));
  const int64_t rows = std::min(xg.dim(0), plan.tokens * plan.top_k);
  detail::moe_gather_launch(x.data(), rows, row_limit(plan), static_cast<int>(x.dim(1)), static_cast<int>(plan.top_k),
                            plan.slot_of_row.data_as<int32_t>(), xg.data(), stream);
}

Tensor moe_gather(const Tensor& x, const MoePlan& plan, cudaStream_t stream) {
  MT_CHECK(x.defined() && x.ndim() == 2, "moe gather: x must be [T, H]");
  MT_CHECK(!plan.local(), "moe gather: a local plan gathers with moe_gather_live");
  const int64_t N = plan.tokens * plan.top_k;
  Tensor xg = Tensor::empty({N, x.dim(1)}, DType::BF16, x.device());
  check_gather(x, plan, xg, N);
  detail::moe_gather_launch(x.data(), N, nullptr, static_cast<int>(x.dim(1)), static_cast<int>(plan.top_k),
                            plan.slot_of_row.data_as<int32_t>(), xg.data(), stream);
  return xg;
}

void moe_combine(const Tensor& y, const Tensor& weights, const MoePlan& plan, Tensor& out, cudaStream_t stream,
                 bool round_product) {
  MT_CHECK(y.defined() && y.ndim() == 2, "moe combine: y must be [T·k, H]");
  const int64_t T = plan.tokens, k = plan.top_k, H = y.dim(1);
  check_rows(y, plan, "moe combine y", H);
  if (weights.defined()) check_device_tensor(weights, "moe combine weights", DType::F32, {T, k});
  check_device_tensor2(out, "moe combine out", DType::BF16, DType::F32, {T, H});
  check_plan(plan, y);
  check_same_device(out, y, "moe combine");
  detail::moe_combine_launch(y.data(), weights.defined() ? weights.data_as<float>() : nullptr,
                             plan.row_of_slot.data_as<int32_t>(), row_limit(plan), T, static_cast<int>(k),
                             static_cast<int>(H), out.data(), out.dtype() == DType::F32, stream, round_product);
}

void moe_combine_backward(const Tensor& dout, const Tensor& y, const Tensor& weights, const MoePlan& plan, Tensor& dy,
                          Tensor& dweights, cudaStream_t stream) {
  MT_CHECK(dout.defined() && dout.ndim() == 2, "moe combine backward: dout must be [T, H]");
  const int64_t T = plan.tokens, k = plan.top_k, H = dout.dim(1);
  check_device_tensor2(dout, "moe combine dout", DType::BF16, DType::F32, {T, H});
  check_rows(dy, plan, "moe combine dy", H);
  if (weights.defined()) {
    check_device_tensor(weights, "moe combine weights", DType::F32, {T, k});
    check_rows(y, plan, "moe combine y", H);
    check_device_tensor(dweights, "moe combine dweights", DType::F32, {T, k});
  }
  check_plan(plan, dout);
  check_same_device(dy, dout, "moe combine backward");
  detail::moe_combine_backward_launch(dout.data(), dout.dtype() == DType::F32, weights.defined() ? y.data() : nullptr,
                                      weights.defined() ? weights.data_as<float>() : nullptr,
                                      plan.row_of_slot.data_as<int32_t>(), row_limit(plan), T, static_cast<int>(k),
                                      static_cast<int>(H), dy.data(),
                                      weights.defined() ? dweights.data_as<float>() : nullptr, stream);
}

void moe_gather_backward(const Tensor& dxg, const MoePlan& plan, Tensor& dx, cudaStream_t stream) {
  moe_combine(dxg, Tensor(), plan, dx, stream);
}

}  // namespace mt::cuda
