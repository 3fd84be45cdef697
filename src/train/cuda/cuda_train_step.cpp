#include "train/cuda/cuda_train_step.h"

#include <algorithm>

#include <cmath>

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/cuda/device_communicator.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/expert_bias.h"
#include "kernels/cuda/grad_norm.h"

namespace mt {

namespace {

float host_scalar(const Tensor& t) { return cuda::to_host(t).to_floats()[0]; }

// The step flushes after its micro-batches, so the model may pair their expert wgrads.
CudaModelOptions model_options(CudaModelOptions o, const CudaTrainStepOptions& so, ExpertLoads& loads) {
  o.pair_expert_wgrad = so.pair_expert_wgrad;
  o.expert_parallel = so.collectives.ep;
  if (so.lora) o.lora = &so.lora->working();
  if (!loads.empty()) o.expert_load = &loads.layers;
  return o;
}

// The layers whose selection bias the update moves: a MoE layer of a router with a correction bias, whose bias is
// an F32 [E] tensor on the device.
void check_device_biases(const DecoderSpec& cfg, const ModelWeights& w, const ExpertLoads& loads, int device) {
  for (int64_t l = 0; l < cfg.num_layers(); ++l)
    for (const Sublayer& sub : cfg.layers[static_cast<size_t>(l)].sublayers) {
      if (sub.kind != SublayerKind::moe || !cfg.moe[static_cast<size_t>(sub.index)].router.correction_bias) continue;
      const Tensor& b = w.layers[static_cast<size_t>(l)].router_score_bias;
      const int64_t E = cfg.moe[static_cast<size_t>(sub.index)].num_experts;
      if (!b.defined() || b.device() != Device::cuda(device) || b.dtype() != DType::F32 || b.shape() != Shape{E} ||
          !loads.layers[static_cast<size_t>(l)].defined())
        fail("moe.bias_update_rate: layer {}'s selection bias (e_score_correction_bias) is not an F32 [{}] tensor on "
             "cuda:{} (found {})",
             l, E, device, b.defined() ? b.desc() + " on " + b.device().str() : "none");
    }
}

// What AdamW updates: every parameter without LoRA; under LoRA the base parameters that train in full (those with
// a gradient buffer), then the adapter's fp32 masters in table order.
std::vector<std::pair<std::string, Tensor*>> trained_parameters(ModelWeights& w, const ModelWeights& grads,
                                                                CudaLora* lora) {
  auto all = w.named_parameters();
  if (!lora) return all;
  std::vector<std::pair<std::string, Tensor*>> r;
  const auto g = grads.named_parameters();
  for (size_t i = 0; i < all.size(); ++i)
    if (g[i].second->defined()) r.push_back(all[i]);
  for (auto& p : lora->masters().named_parameters()) r.push_back(p);
  return r;
}

// The offsets of the parameters this rank's AdamW keeps in the whole parameter list's element order (the
// stochastic-rounding stream does not depend on the sharding).
std::vector<int64_t> updated_offsets(ModelWeights& w, const OptimizerShards& shards) {
  std::vector<int64_t> r;
  int64_t at = 0;
  auto all = w.named_parameters();
  for (size_t i = 0; i < all.size(); ++i) {
    if (shards.updates(i)) r.push_back(at);
    at += all[i].second->numel();
  }
  return r;
}

}  // namespace

ModelWeights cuda_lora_base_grads(const DecoderSpec& cfg, const LoraTable& table, int device) {
  ModelWeights g = lora_base_grads(cfg, table);
  for (auto& [name, t] : g.named_parameters())
    if (t->defined()) *t = cuda::to_device(*t, device);
  return g;
}

ModelWeights cuda_grad_buffers(const DecoderSpec& cfg, DType expert_dtype, int device, int64_t experts_held) {
  ModelWeights w = ModelWeights::empty_like_config(cfg, DType::F32, Device::cuda(device), experts_held);
  cuda::DeviceContext& ctx = cuda::device_context(device);
  for (auto& L : w.layers)
    for (Tensor* t : {&L.experts_gate_up, &L.experts_down})
      if (t->defined() && expert_dtype != DType::F32) *t = Tensor::empty(t->shape(), expert_dtype, Device::cuda(device));
  for (auto& [name, t] : w.named_parameters()) cuda::fill_zero_async(*t, ctx.stream);
  return w;
}

CudaTrainStep::CudaTrainStep(const DecoderSpec& cfg, ModelWeights& weights, int device,
                             const CudaTrainStepOptions& o)
    : device_(device),
      col_(o.collectives),
      weights_(weights),
      loads_host_(ExpertLoads::zeros(cfg)),
      loads_(loads_host_.like(Device::cuda(device))),
      expert_bias_rate_(o.expert_bias_rate),
      model_(cfg, weights, device, model_options(o.model, o, loads_)),
      lora_(o.lora),
      grads_(o.lora ? cuda_lora_base_grads(cfg, *o.lora->masters().table, device)
                    : cuda_grad_buffers(cfg, o.expert_grad_dtype, device, model_.experts_held())),
      lora_grads_(o.lora ? o.lora->zero_grads() : LoraWeights()),
      shards_(o.shards),
      params_sharded_(o.params_sharded),
      adamw_(o.lora ? trained_parameters(weights, grads_, o.lora) : o.shards.updated(weights.named_parameters()),
             o.adamw, o.decays, cuda::device_context(device).stream,
             o.lora ? std::vector<int64_t>() : updated_offsets(weights, o.shards)) {
  MT_CHECK(!lora_ || (!col_.active() && !shards_.active() && !params_sharded_),
           "LoRA on the GPU trains on one GPU (no data or expert parallelism, no sharding)");
  MT_CHECK(!lora_ || lora_->device() == device, "LoRA adapter on cuda:{}, the step on cuda:{}", lora_ ? lora_->device() : 0,
           device);
  MT_CHECK(!col_.ep || (col_.world && col_.host), "expert parallelism needs the world and host communicators");
  MT_CHECK(!shards_.active() || (col_.world && col_.world->size() == shards_.world()),
           "a sharded optimizer needs the world communicator of its {} ranks", shards_.world());
  MT_CHECK(!params_sharded_ || (shards_.active() && o.model.residency), "sharded parameters need ZeRO-1 owners and a residency");
  MT_CHECK(!shards_.experts_sharded() ||
               (col_.ep && col_.expert_replicas &&
                col_.expert_replicas->size() == static_cast<int>(shards_.replicas().size()) &&
                col_.expert_replicas->rank() == shards_.replica_index(shards_.rank())),
           "expert stacks sharded over {} replicas need the replica communicator with this rank at its position",
           shards_.replicas().size());
  for (auto& [name, g] : grads_.named_parameters()) {
    if (!g->defined()) continue;  // frozen (LoRA)
    if (lora_ || shards_.updates(grad_list_.size())) updated_grads_.push_back(g);
    grad_list_.push_back(g);
    is_expert_.push_back(grads_.param_table().is_expert_stack(name));
  }
  for (auto& [name, g] : lora_grads_.named_parameters()) {  // the adapter's, after the base's (AdamW's order)
    updated_grads_.push_back(g);
    grad_list_.push_back(g);
    is_expert_.push_back(false);
  }
  for (auto& [name, t] : weights.named_parameters()) params_.push_back(t);
  MT_CHECK(std::isfinite(expert_bias_rate_) && expert_bias_rate_ >= 0, "expert bias rate {}", expert_bias_rate_);
  MT_CHECK(!lora_ || expert_bias_rate_ == 0, "LoRA keeps the base frozen: no expert bias update");
  if (expert_bias_rate_ > 0) check_device_biases(cfg, weights, loads_, device);
  norm_ = Tensor::empty({1}, DType::F32, Device::cuda(device));
  coef_ = Tensor::empty({1}, DType::F32, Device::cuda(device));
}

EngineStep CudaTrainStep::step(const std::vector<CudaBatch>& window, double ce_divisor, double lr,
                               double max_grad_norm) {
  cudaStream_t stream = cuda::device_context(device_).stream;
  ++steps_;
  bool rerun = false;
  EngineStep s = run_window(window, ce_divisor, max_grad_norm, /*exact_rows=*/false, &rerun);
  if (rerun) {  // some rank dropped expert rows past its budget: these gradients are wrong, count exactly
    ++reruns_;
    s = run_window(window, ce_divisor, max_grad_norm, /*exact_rows=*/true, &rerun);
    MT_CHECK(!rerun, "step {}: expert rows passed their budget with exact counts", steps_);
  }
  if (s.finite) {
    // The loads summed over the ranks back on the device while the stream is idle (the copy waits for it).
    if (expert_bias_rate_ > 0 && col_.host) cuda::copy_host_to_device(loads_.flat, loads_host_.flat);
    adamw_.step(updated_grads_, lr, &coef_, stream);
    if (shards_.active()) broadcast_updates(stream);
    if (lora_) lora_->refresh();  // the GEMMs' bf16 copies of the updated masters
    if (expert_bias_rate_ > 0) update_expert_biases(stream);
  }
  model_.timer().mark(cuda::Phase::other, stream);
  return s;
}

EngineStep CudaTrainStep::run_window(const std::vector<CudaBatch>& window, double ce_divisor, double max_grad_norm,
                                     bool exact_rows, bool* rerun) {
  cudaStream_t stream = cuda::device_context(device_).stream;
  cuda::PhaseTimer& timer = model_.timer();
  timer.mark(cuda::Phase::other, stream);
  if (col_.ep) col_.ep->begin_step(stream, exact_rows);
  // The stacked expert weight gradients are not zeroed: their first wgrad pass of the step stores (the largest
  // gradients; saves the memset and one read of dW per layer). Every other gradient is summed into, so zeroed: the
  // per-expert biases too (expert stacks, but their kernels add, and no wgrad pass would mark them written).
  std::vector<const Tensor*> stored;
  for (LayerWeights& L : grads_.layers)
    for (const Tensor* t : {&L.experts_gate_up, &L.experts_down})
      if (t->defined()) stored.push_back(t);
  for (auto& [name, g] : grads_.named_parameters()) {
    if (!g->defined()) continue;  // frozen (LoRA)
    if (std::find(stored.begin(), stored.end(), g) != stored.end())
      model_.overwrite_expert_grad_next(*g);
    else
      cuda::fill_zero_async(*g, stream);
  }
  for (auto& [name, g] : lora_grads_.named_parameters()) cuda::fill_zero_async(*g, stream);
  if (!loads_.empty()) cuda::fill_zero_async(loads_.flat, stream);  // a rerun counts again
  std::vector<CudaLoss> losses;
  for (const CudaBatch& b : window)
    losses.push_back(lora_ ? model_.forward_backward(b, grads_, lora_grads_, ce_divisor)
                           : model_.forward_backward(b, grads_, ce_divisor));
  model_.flush_expert_grads();
  if (col_.active()) {
    timer.mark(cuda::Phase::grad_sync, stream);
    reduce_gradients(stream);
  }
  timer.mark(cuda::Phase::optimizer, stream);
  std::function<void(Tensor&)> reduce;
  if (col_.ep || shards_.active()) reduce = [&](Tensor& sumsq) { complete_sumsq(sumsq, stream); };
  cuda::grad_norm_clip_coef(grad_list_, static_cast<float>(max_grad_norm), norm_, coef_, stream, reduce);

  // The step's one sync: the losses and the norm decide whether the update runs. Across GPUs the wait
  // is bounded by the job's timeout.
  if (col_.active()) col_.world->wait(stream, "step " + std::to_string(steps_) + ": gradient reduction");
  EngineStep s;
  s.grad_norm = host_scalar(norm_);
  const double coef = model_.config().aux_loss_coef();
  for (const CudaLoss& l : losses) {
    const double ce = host_scalar(l.ce_sum) / ce_divisor;
    const double aux = l.aux.defined() ? host_scalar(l.aux) : 0.0;
    s.ce_loss += ce;
    s.aux_loss += aux;
    s.loss += ce + (l.aux.defined() ? coef * aux : 0.0);
  }
  double micro_batches = static_cast<double>(window.size());
  // Layers whose expert rows passed their budget: any on any rank reruns the step on every rank.
  double overflows = col_.ep ? static_cast<double>(col_.ep->end_step(stream).overflows) : 0.0;
  if (!loads_.empty()) cuda::copy_device_to_host(loads_host_.flat, loads_.flat);  // after the sync: a small copy
  if (col_.host) {  // every rank's loss sums (each rank ran its own micro-batches) and expert loads (exact as doubles)
    std::vector<double> sums = {s.loss, s.ce_loss, s.aux_loss, micro_batches, overflows};
    const int64_t nloads = loads_.empty() ? 0 : loads_host_.flat.numel();
    int32_t* load = nloads ? loads_host_.flat.data_as<int32_t>() : nullptr;
    for (int64_t i = 0; i < nloads; ++i) sums.push_back(load[i]);
    col_.host->all_reduce_sum(sums.data(), static_cast<int64_t>(sums.size()),
                              "all_reduce(loss sums and expert loads, step " + std::to_string(steps_) + ")");
    s.loss = sums[0], s.ce_loss = sums[1], s.aux_loss = sums[2], micro_batches = sums[3], overflows = sums[4];
    for (int64_t i = 0; i < nloads; ++i) {
      const double v = sums[5 + static_cast<size_t>(i)];
      MT_CHECK(v <= 2147483647.0, "step {}: an expert load of {} slots over the ranks (more than int32 holds)", steps_, v);
      load[i] = static_cast<int32_t>(v);
    }
  }
  s.expert_load_max_over_mean = expert_loads_max_over_mean(loads_host_);
  if (micro_batches > 0) s.aux_loss /= micro_batches;
  s.finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
  *rerun = overflows > 0;
  return s;
}

// DeepSeek-V3's bias update after the optimizer step, every rank alike from the loads summed over the ranks (on the
// host, with the loss sums; step() put them back on the device): each layer's bias by kernels/cuda/expert_bias.h,
// bitwise the CPU rule.
void CudaTrainStep::update_expert_biases(cudaStream_t stream) {
  for (size_t l = 0; l < loads_.layers.size(); ++l) {
    Tensor& bias = weights_.layers[l].router_score_bias;
    if (loads_.layers[l].defined() && bias.defined()) cuda::expert_bias_update(loads_.layers[l], bias, expert_bias_rate_, stream);
  }
}

// Every sharded parameter from its owner to the other ranks (one NCCL group): over the world, and the expert
// stacks over their replicas; unless ZeRO-3 fetches them from their owners at their next use.
void CudaTrainStep::broadcast_updates(cudaStream_t stream) {
  std::vector<DeviceCommunicator::Broadcast> parts, experts;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = *params_[i];
    if (shards_.over_replicas(i) && !params_sharded_)
      experts.push_back({p.data(), p.numel(), p.dtype(), shards_.replica_index(shards_.owner(i))});
    else if (shards_.over_replicas(i))
      continue;
    else if (shards_.world_owner(i) >= 0 && !params_sharded_)
      parts.push_back({p.data(), p.numel(), p.dtype(), shards_.world_owner(i)});
  }
  const std::string step = "step " + std::to_string(steps_);
  if (!parts.empty()) col_.world->broadcast(parts, stream, "broadcast(updated parameters, " + step + ")");
  if (!experts.empty())
    col_.expert_replicas->broadcast(experts, stream, "broadcast(updated expert stacks over replicas, " + step + ")");
}

int64_t CudaTrainStep::optimizer_state_bytes() {
  int64_t b = 0;
  for (auto& [name, t] : adamw_.named_state()) b += static_cast<int64_t>(t->nbytes());
  return b;
}

// A sharded tensor's gradient is summed onto its owner only (the one rank whose AdamW reads it): over every
// rank, or for an expert stack sharded over its replicas over those; the others' copies keep their own partial
// sums, which nothing reads. The rest are all-reduced: over every rank, or for the experts under expert
// parallelism over the ranks holding the same experts.
void CudaTrainStep::reduce_gradients(cudaStream_t stream) {
  std::vector<DeviceCommunicator::Buffer> replicated, experts;
  std::vector<DeviceCommunicator::Reduce> to_owner, to_replica_owner;
  for (size_t i = 0; i < grad_list_.size(); ++i) {
    Tensor* g = const_cast<Tensor*>(grad_list_[i]);
    if (shards_.over_replicas(i)) {
      to_replica_owner.push_back({g->data(), g->numel(), g->dtype(), shards_.replica_index(shards_.owner(i))});
      continue;
    }
    if (const int owner = shards_.world_owner(i); owner >= 0) {
      to_owner.push_back({g->data(), g->numel(), g->dtype(), owner});
      continue;
    }
    DeviceCommunicator::Buffer b{g->data(), g->numel(), g->dtype()};
    (is_expert_[i] && col_.ep ? experts : replicated).push_back(b);
  }
  const std::string step = "step " + std::to_string(steps_);
  if (!to_owner.empty()) col_.world->reduce_sum(to_owner, stream, "reduce(gradients to their owners, " + step + ")");
  if (!replicated.empty()) col_.world->all_reduce_sum(replicated, stream, "all_reduce(gradients, " + step + ")");
  if (!experts.empty() && col_.expert_replicas)
    col_.expert_replicas->all_reduce_sum(experts, stream, "all_reduce(expert gradients over replicas, " + step + ")");
  if (!to_replica_owner.empty())
    col_.expert_replicas->reduce_sum(to_replica_owner, stream,
                                     "reduce(expert gradients to their owners among the replicas, " + step + ")");
}

// Completes the per-tensor Σ g² across ranks: each expert tensor's summed over the EP group (every rank holds a
// slice of the experts); a sharded tensor's taken from its owner, the one rank holding its summed gradient (a
// copy, so the norm is bitwise the unsharded one). An expert stack sharded over its replicas has its owners in
// one EP group (the same map in every replica group: the owner at replica position j for every slice is a rank
// of group j), so that group's sum is the unsharded one; its replicas then take it from the owner.
void CudaTrainStep::complete_sumsq(Tensor& sumsq, cudaStream_t stream) {
  double* base = sumsq.data_as<double>();
  const std::string step = "step " + std::to_string(steps_);
  if (col_.ep) {
    std::vector<DeviceCommunicator::Buffer> parts;
    for (size_t i = 0; i < grad_list_.size(); ++i)
      if (is_expert_[i] && shards_.world_owner(i) < 0) parts.push_back({base + i, 1, DType::F64});
    if (!parts.empty()) col_.ep->comm().all_reduce_sum(parts, stream, "all_reduce(expert gradient norms, " + step + ")");
  }
  std::vector<DeviceCommunicator::Broadcast> owned, expert_owned;
  for (size_t i = 0; i < grad_list_.size(); ++i) {
    if (shards_.over_replicas(i))
      expert_owned.push_back({base + i, 1, DType::F64, shards_.replica_index(shards_.owner(i))});
    else if (shards_.world_owner(i) >= 0)
      owned.push_back({base + i, 1, DType::F64, shards_.world_owner(i)});
  }
  if (!owned.empty()) col_.world->broadcast(owned, stream, "broadcast(gradient norms from their owners, " + step + ")");
  if (!expert_owned.empty())
    col_.expert_replicas->broadcast(expert_owned, stream,
                                    "broadcast(expert gradient norms from their owners' group, " + step + ")");
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
