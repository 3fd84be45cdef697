#include "train/cuda/cuda_engine_setup.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "core/error.h"
#include "distributed/ep_dispatch_mode.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_copy.h"
#include "train/train_engine.h"

namespace mt {

ModelWeights cuda_upload_bf16(const DecoderSpec& cfg, const ModelWeights& host, int device, const ExpertSlice& sl,
                              const OptimizerShards* params_owned) {
  ModelWeights d = ModelWeights::absent_like_config(cfg, DType::BF16, Device::cuda(device), sl.count);
  auto src = host.named_parameters();
  auto dst = d.named_parameters();
  for (size_t i = 0; i < src.size(); ++i) {
    if (params_owned && !params_owned->keeps_weights(i)) continue;
    Tensor& t = *dst[i].second;
    t = Tensor::empty(t.shape(), t.dtype(), t.device());
    const Tensor h = sl.of(src[i].first, *src[i].second);
    cuda::copy_host_to_device(t, h.dtype() == DType::BF16 ? h : h.to(DType::BF16));
  }
  // Buffers (never trained, replicated on every rank, whatever the sharding) keep their own dtype (F32).
  auto bsrc = host.named_buffers();
  auto bdst = d.named_buffers();
  for (size_t i = 0; i < bsrc.size(); ++i) *bdst[i].second = cuda::to_device(*bsrc[i].second, device);
  return d;
}

CudaTrainStepOptions cuda_step_options(const Recipe& r) {
  CudaTrainStepOptions o;
  o.model.recompute = recompute_parse(r.train.recompute, "train.recompute");
  o.model.deterministic = r.train.deterministic;
  o.adamw.hyper = adamw_options_from(r);
  o.adamw.bf16_master = o.adamw.hyper.master_weights;
  o.adamw.moment_dtype = r.optimizer.moment_dtype == "bfloat16" ? DType::BF16 : DType::F32;
  o.adamw.seed = r.train.seed;
  o.expert_grad_dtype = r.optimizer.expert_grad_dtype == "bfloat16" ? DType::BF16 : DType::F32;
  if (!r.optimizer.decay_norms_and_biases) o.decays = adamw_hf_decays;
  o.expert_bias_rate = r.moe.bias_update_rate;
  return o;
}

MemoryPlanInput cuda_memory_plan_input(const DecoderSpec& cfg, const Recipe& r, int64_t ep, int64_t world) {
  size_t free_b = 0, total_b = 0;
  MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  MemoryPlanInput in;
  in.cfg = cfg;
  in.micro_batch = r.train.micro_batch_size;
  in.seq = r.data.seq_len;
  in.recompute = recompute_parse(r.train.recompute, "train.recompute");
  in.deterministic = r.train.deterministic;
  in.fp32_master = r.optimizer.master_weights == "float32";
  in.bf16_moments = r.optimizer.moment_dtype == "bfloat16";
  in.bf16_expert_grads = r.optimizer.expert_grad_dtype == "bfloat16";
  in.expert_parallel = ep;
  in.optimizer_shards = world > 1 && r.parallel.shard_optimizer ? world : 1;
  in.shard_parameters = world > 1 && r.parallel.shard_parameters;
  in.reshard_after_forward = r.parallel.reshard_after_forward;
  in.ep_all_gather = ep > 1 && ep_dispatch_mode_parse(r.parallel.ep_dispatch, ep, cfg.experts_per_token(),
                                                      "parallel.ep_dispatch") == EpDispatchMode::all_gather;
  in.ep_row_headroom = r.parallel.ep_row_headroom;
  in.device_bytes = static_cast<int64_t>(total_b);
  in.reserve_bytes = memory_plan_reserve_bytes(in.device_bytes);
  return in;
}

void cuda_memory_plan_check(const MemoryPlanInput& in, int device, std::FILE* log) {
  const MemoryPlan p = memory_plan(in);
  if (log) std::fprintf(log, "%s\n", p.table().c_str());
  if (!p.fits) fail("cuda:{}: {}", device, p.refusal());
}

void cuda_copy_to_host_converting(const Tensor& dev, Tensor& host) {
  if (host.dtype() == dev.dtype()) {
    cuda::copy_device_to_host(host, dev);
    return;
  }
  const Tensor h = cuda::to_host(dev).to(host.dtype());
  std::memcpy(host.data(), h.data(), host.nbytes());
}

}  // namespace mt
