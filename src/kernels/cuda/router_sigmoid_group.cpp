#include "kernels/cuda/router_sigmoid_group.h"

#include "core/error.h"
#include "kernels/cuda/device_tensor_check.h"
#include "kernels/cuda/router_sigmoid_group_kernels.h"

namespace mt::cuda {

RouterResult router_sigmoid_group_forward(const Tensor& logits, const Tensor& correction_bias,
                                          const SigmoidGroupRouting& r, Tensor* expert_load, cudaStream_t stream) {
  MT_CHECK(logits.defined() && logits.ndim() == 2, "router logits must be [T, E], got {}",
           logits.defined() ? logits.desc() : "undefined");
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_device_tensor2(logits, "router logits", DType::F32, DType::BF16, {T, E});
  cpu::check_sigmoid_group_routing(r, E);
  if (E > 1024) fail("sigmoid group router: {} experts (the CUDA kernel supports up to 1024)", E);
  if (r.top_k > 32) fail("sigmoid group router: num_experts_per_tok {} (the CUDA kernel supports up to 32)", r.top_k);
  MT_CHECK(T < (int64_t{1} << 31) / E, "router: {} tokens", T);
  if (correction_bias.defined()) {
    check_device_tensor(correction_bias, "e_score_correction_bias", DType::F32, {E});
    check_same_device(correction_bias, logits, "e_score_correction_bias");
  }
  if (expert_load) {
    check_device_tensor(*expert_load, "expert load", DType::I32, {E});
    check_same_device(*expert_load, logits, "expert load");
  }
  RouterResult out{Tensor::empty({T, r.top_k}, DType::I32, logits.device()),
                   Tensor::empty({T, r.top_k}, DType::F32, logits.device())};
  if (T == 0) return out;
  detail::router_sigmoid_group_forward_launch(
      logits.data(), logits.dtype() == DType::BF16,
      correction_bias.defined() ? correction_bias.data_as<float>() : nullptr, static_cast<int>(T),
      static_cast<int>(E), static_cast<int>(r.top_k), static_cast<int>(r.groups), static_cast<int>(r.topk_groups),
      r.norm_topk_prob, static_cast<float>(r.scale), out.index.data_as<int32_t>(), out.weights.data_as<float>(),
      expert_load ? expert_load->data_as<int32_t>() : nullptr, stream);
  return out;
}

void router_sigmoid_group_backward(const Tensor& dweights, const Tensor& logits, const RouterResult& route,
                                   const SigmoidGroupRouting& r, Tensor& dlogits, cudaStream_t stream) {
  MT_CHECK(logits.defined() && logits.ndim() == 2, "router logits must be [T, E]");
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_device_tensor2(logits, "router logits", DType::F32, DType::BF16, {T, E});
  MT_CHECK(route.index.defined() && route.index.ndim() == 2, "router backward without a forward result");
  const int64_t k = route.index.dim(1);
  MT_CHECK(k == r.top_k, "router backward: top_k {} but the index has {} slots", r.top_k, k);
  MT_CHECK(E >= 1 && E <= 1024 && k >= 1 && k <= E && k <= 32, "router backward: E {} k {}", E, k);
  MT_CHECK(T < (int64_t{1} << 31) / E, "router: {} tokens", T);
  check_device_tensor(route.index, "router index", DType::I32, {T, k});
  check_device_tensor(dweights, "router dweights", DType::F32, {T, k});
  check_device_tensor2(dlogits, "router dlogits", DType::F32, DType::BF16, {T, E});
  check_same_device(dlogits, logits, "router backward");
  check_same_device(route.index, logits, "router backward");
  check_same_device(dweights, logits, "router backward");
  if (T == 0) return;
  detail::router_sigmoid_group_backward_launch(
      dweights.data_as<float>(), logits.data(), logits.dtype() == DType::BF16, route.index.data_as<int32_t>(),
      static_cast<int>(T), static_cast<int>(E), static_cast<int>(k), r.norm_topk_prob, static_cast<float>(r.scale),
      dlogits.data(), dlogits.dtype() == DType::BF16, stream);
}

void router_expert_load_add(const Tensor& index, Tensor& load, cudaStream_t stream) {
  MT_CHECK(index.defined() && index.ndim() == 2, "expert load: index must be [T, k]");
  MT_CHECK(load.defined() && load.ndim() == 1, "expert load must be [E]");
  check_device_tensor(index, "router index", DType::I32, index.shape());
  check_device_tensor(load, "expert load", DType::I32, load.shape());
  check_same_device(index, load, "expert load");
  MT_CHECK(load.dim(0) >= 1 && load.dim(0) <= (int64_t{1} << 30), "expert load of {} experts", load.dim(0));
  if (index.numel() == 0) return;
  detail::router_expert_load_launch(index.data_as<int32_t>(), index.numel(), static_cast<int>(load.dim(0)),
                                    load.data_as<int32_t>(), stream);
}

}  // namespace mt::cuda
