#include "kernels/cuda/router.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_tensor_check.h"
#include "kernels/cuda/router_kernels.h"

namespace mt::cuda {

AuxStats aux_stats_zeros(int64_t experts, int device, cudaStream_t stream) {
  AuxStats s{Tensor::empty({experts}, DType::I32, Device::cuda(device)),
             Tensor::empty({experts}, DType::F32, Device::cuda(device)), 0};
  if (experts > 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(s.count.data(), 0, s.count.nbytes(), stream));
    MT_CUDA_CHECK(cudaMemsetAsync(s.psum.data(), 0, s.psum.nbytes(), stream));
  }
  return s;
}

namespace {

// Both routers: topk_softmax picks GPT-OSS's (norm_topk_prob unused), else Qwen's.
RouterResult route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, bool topk_softmax, bool bf16,
                   AuxStats* stats, cudaStream_t stream) {
  MT_CHECK(logits.defined() && logits.ndim() == 2, "router logits must be [T, E], got {}",
           logits.defined() ? logits.desc() : "undefined");
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_device_tensor2(logits, "router logits", DType::F32, DType::BF16, {T, E});
  MT_CHECK(E >= 1 && E <= 1024, "router: {} experts (supported 1..1024)", E);
  MT_CHECK(top_k >= 1 && top_k <= E && top_k <= 32, "router top-k {} with {} experts (supported up to 32)", top_k, E);
  MT_CHECK(T < (int64_t{1} << 31) / E, "router: {} tokens", T);
  RouterResult r{Tensor::empty({T, top_k}, DType::I32, logits.device()),
                 Tensor::empty({T, top_k}, DType::F32, logits.device())};
  if (stats) {
    check_device_tensor(stats->count, "aux stats count", DType::I32, {E});
    check_device_tensor(stats->psum, "aux stats psum", DType::F32, {E});
    check_same_device(stats->count, logits, "aux stats");
  }
  if (T == 0) return r;
  // At most ~2048 blocks, so at most 2048 partial rows of statistics; the split depends only on T,
  // so the fixed-order reduction gives the same bits on every run.
  const int64_t tokens_per_block = std::max<int64_t>(detail::kRouterWarps, (T + 2047) / 2048);
  const int blocks = static_cast<int>((T + tokens_per_block - 1) / tokens_per_block);
  Tensor part_count, part_psum;
  if (stats) {
    part_count = Tensor::empty({blocks, E}, DType::I32, logits.device());
    part_psum = Tensor::empty({blocks, E}, DType::F32, logits.device());
  }
  detail::router_forward_launch(logits.data(), logits.dtype() == DType::BF16, static_cast<int>(T), static_cast<int>(E),
                                static_cast<int>(top_k), norm_topk_prob, bf16, topk_softmax,
                                static_cast<int>(tokens_per_block),
                                blocks, r.index.data_as<int32_t>(), r.weights.data_as<float>(),
                                stats ? part_count.data_as<int32_t>() : nullptr,
                                stats ? part_psum.data_as<float>() : nullptr, stream);
  if (stats) {
    detail::aux_stats_reduce_launch(part_count.data_as<int32_t>(), part_psum.data_as<float>(), blocks,
                                    static_cast<int>(E), stats->count.data_as<int32_t>(), stats->psum.data_as<float>(),
                                    stream);
    stats->rows += T;
  }
  return r;
}

}  // namespace

RouterResult router_forward(const Tensor& logits, int64_t top_k, bool norm_topk_prob, bool bf16, AuxStats* stats,
                            cudaStream_t stream) {
  return route(logits, top_k, norm_topk_prob, false, bf16, stats, stream);
}

RouterResult router_topk_softmax_forward(const Tensor& logits, int64_t top_k, bool bf16, AuxStats* stats,
                                         cudaStream_t stream) {
  return route(logits, top_k, false, true, bf16, stats, stream);
}

void aux_loss_finish(const AuxStats& stats, bool bf16, double daux, Tensor& aux, Tensor& aux_dp, cudaStream_t stream) {
  MT_CHECK(stats.count.defined() && stats.count.ndim() == 1, "aux stats without counts");
  const int64_t E = stats.count.dim(0);
  check_device_tensor(stats.count, "aux stats count", DType::I32, {E});
  check_device_tensor(stats.psum, "aux stats psum", DType::F32, {E});
  aux = Tensor::empty({1}, DType::F32, stats.count.device());
  aux_dp = Tensor::empty({E}, DType::F32, stats.count.device());
  detail::aux_loss_finish_launch(stats.count.data_as<int32_t>(), stats.psum.data_as<float>(), static_cast<int>(E),
                                 static_cast<double>(stats.rows), bf16, daux, aux.data_as<float>(),
                                 aux_dp.data_as<float>(), stream);
}

namespace {
std::atomic<bool> g_balanced_routing_probe{false};
}  // namespace

void set_balanced_routing_probe(bool on) { g_balanced_routing_probe.store(on); }
bool balanced_routing_probe() { return g_balanced_routing_probe.load(); }

void router_force_balanced(RouterResult& r, int64_t experts, cudaStream_t stream) {
  MT_CHECK(r.index.defined() && r.index.ndim() == 2, "balanced routes need the router's [T, k] index");
  const int64_t T = r.index.dim(0), k = r.index.dim(1);
  check_device_tensor(r.index, "router index", DType::I32, {T, k});
  MT_CHECK(k >= 1 && k <= experts && experts <= 1024, "balanced routes: top-k {} of {} experts", k, experts);
  if (T == 0) return;
  detail::router_balanced_index_launch(r.index.data_as<int32_t>(), T, static_cast<int>(k), static_cast<int>(experts),
                                       stream);
}

namespace {
std::atomic<int> g_routing_fault_probe{0};
}  // namespace

void set_routing_fault_probe(int every) { g_routing_fault_probe.store(every > 0 ? every : 0); }
int routing_fault_probe() { return g_routing_fault_probe.load(); }

void router_inject_fault(RouterResult& r, const Tensor& logits, int every, cudaStream_t stream) {
  MT_CHECK(r.index.defined() && r.index.ndim() == 2 && logits.defined() && logits.ndim() == 2,
           "routing fault probe needs the router's [T, k] index and [T, E] logits");
  const int64_t T = r.index.dim(0), k = r.index.dim(1), E = logits.dim(1);
  check_device_tensor(r.index, "router index", DType::I32, {T, k});
  check_device_tensor2(logits, "router logits", DType::F32, DType::BF16, {T, E});
  MT_CHECK(every > 0 && k < E, "routing fault probe: every {} with top-{} of {} experts", every, k, E);
  if (T == 0) return;
  detail::router_fault_index_launch(r.index.data_as<int32_t>(), logits.data(), logits.dtype() == DType::BF16,
                                    T, static_cast<int>(k), static_cast<int>(E), every, stream);
}

namespace {
void route_backward(const Tensor& dweights, const Tensor& logits, const RouterResult& r, bool norm_topk_prob,
                    bool topk_softmax, const Tensor& aux_dp, bool bf16, Tensor& dlogits, cudaStream_t stream) {
  MT_CHECK(logits.defined() && logits.ndim() == 2, "router logits must be [T, E]");
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_device_tensor2(logits, "router logits", DType::F32, DType::BF16, {T, E});
  MT_CHECK(r.index.defined() && r.index.ndim() == 2, "router backward without a forward result");
  const int64_t k = r.index.dim(1);
  MT_CHECK(E >= 1 && E <= 1024 && k >= 1 && k <= E && k <= 32, "router backward: E {} k {}", E, k);
  check_device_tensor(r.index, "router index", DType::I32, {T, k});
  check_device_tensor(dweights, "router dweights", DType::F32, {T, k});
  check_device_tensor2(dlogits, "router dlogits", DType::F32, DType::BF16, {T, E});
  if (aux_dp.defined()) check_device_tensor(aux_dp, "aux_dp", DType::F32, {E});
  check_same_device(dlogits, logits, "router backward");
  if (T == 0) return;
  detail::router_backward_launch(dweights.data_as<float>(), logits.data(), logits.dtype() == DType::BF16,
                                 r.index.data_as<int32_t>(), aux_dp.defined() ? aux_dp.data_as<float>() : nullptr,
                                 static_cast<int>(T), static_cast<int>(E), static_cast<int>(k), norm_topk_prob, bf16,
                                 topk_softmax, dlogits.data(), dlogits.dtype() == DType::BF16, stream);
}
}  // namespace

void router_backward(const Tensor& dweights, const Tensor& logits, const RouterResult& r, bool norm_topk_prob,
                     const Tensor& aux_dp, bool bf16, Tensor& dlogits, cudaStream_t stream) {
  route_backward(dweights, logits, r, norm_topk_prob, false, aux_dp, bf16, dlogits, stream);
}

void router_topk_softmax_backward(const Tensor& dweights, const Tensor& logits, const RouterResult& r,
                                  const Tensor& aux_dp, bool bf16, Tensor& dlogits, cudaStream_t stream) {
  route_backward(dweights, logits, r, false, true, aux_dp, bf16, dlogits, stream);
}

}  // namespace mt::cuda
