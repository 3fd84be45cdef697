#include "train/cuda/cuda_train_step.h"

#include <cmath>

#include "core/error.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/grad_norm.h"

namespace mt {

namespace {

float host_scalar(const Tensor& t) { return cuda::to_host(t).to_floats()[0]; }

// The step flushes after its micro-batches, so the model may pair their expert wgrads.
CudaModelOptions with_pairing(CudaModelOptions o, bool pair) {
  o.pair_expert_wgrad = pair;
  return o;
}

}  // namespace

bool pairing_wanted(MemoryPlanInput in, int64_t grad_accum) {
  if (grad_accum < 2) return false;  // nothing to pair with: holding would only raise the peak
  in.pair_expert_wgrad = true;
  return memory_plan(in).fits;
}

Qwen3MoeWeights cuda_grad_buffers(const Qwen3MoeConfig& cfg, DType expert_dtype, int device) {
  Qwen3MoeWeights w = Qwen3MoeWeights::empty_like_config(cfg, DType::F32, Device::cuda(device));
  cuda::DeviceContext& ctx = cuda::device_context(device);
  for (auto& L : w.layers)
    for (Tensor* t : {&L.experts_gate_up, &L.experts_down})
      if (t->defined() && expert_dtype != DType::F32) *t = Tensor::empty(t->shape(), expert_dtype, Device::cuda(device));
  for (auto& [name, t] : w.named_parameters()) cuda::fill_zero_async(*t, ctx.stream);
  return w;
}

CudaTrainStep::CudaTrainStep(const Qwen3MoeConfig& cfg, Qwen3MoeWeights& weights, int device,
                             const CudaTrainStepOptions& o)
    : device_(device),
      model_(cfg, weights, device, with_pairing(o.model, o.pair_expert_wgrad)),
      grads_(cuda_grad_buffers(cfg, o.expert_grad_dtype, device)),
      adamw_(weights.named_parameters(), o.adamw, o.decays, cuda::device_context(device).stream) {
  for (auto& [name, g] : grads_.named_parameters()) grad_list_.push_back(g);
  norm_ = Tensor::empty({1}, DType::F32, Device::cuda(device));
  coef_ = Tensor::empty({1}, DType::F32, Device::cuda(device));
}

EngineStep CudaTrainStep::step(const std::vector<CudaBatch>& window, double ce_divisor, double lr,
                               double max_grad_norm) {
  cudaStream_t stream = cuda::device_context(device_).stream;
  cuda::PhaseTimer& timer = model_.timer();
  timer.mark(cuda::Phase::other, stream);
  for (auto& [name, g] : grads_.named_parameters()) cuda::fill_zero_async(*g, stream);
  std::vector<CudaLoss> losses;
  for (const CudaBatch& b : window) losses.push_back(model_.forward_backward(b, grads_, ce_divisor));
  model_.flush_expert_grads();
  timer.mark(cuda::Phase::optimizer, stream);
  cuda::grad_norm_clip_coef(grad_list_, static_cast<float>(max_grad_norm), norm_, coef_, stream);

  // The step's one sync: the losses and the norm decide whether the update runs.
  EngineStep s;
  s.grad_norm = host_scalar(norm_);
  const double coef = model_.config().router_aux_loss_coef;
  for (const CudaLoss& l : losses) {
    const double ce = host_scalar(l.ce_sum) / ce_divisor;
    const double aux = l.aux.defined() ? host_scalar(l.aux) : 0.0;
    s.ce_loss += ce;
    s.aux_loss += aux;
    s.loss += ce + (l.aux.defined() ? coef * aux : 0.0);
  }
  if (!window.empty()) s.aux_loss /= static_cast<double>(window.size());
  s.finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
  if (s.finite) adamw_.step(grad_list_, lr, &coef_, stream);
  timer.mark(cuda::Phase::other, stream);
  return s;
}

EngineEval CudaTrainStep::eval(const CudaBatch& b) {
  CudaLoss l = model_.forward(b);
  EngineEval e;
  e.ce_sum = host_scalar(l.ce_sum);
  e.tokens = cuda::to_host(l.count).data_as<int32_t>()[0];
  e.aux_loss = l.aux.defined() ? host_scalar(l.aux) : 0.0;
  return e;
}

}  // namespace mt
