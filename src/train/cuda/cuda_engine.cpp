// The CUDA training engine (train/train_engine.h): the CausalLM stays the host copy that checkpoints
// are written from; the GPU holds BF16 parameters, FP32 gradients and the AdamW state. model.dtype
// float32 on CUDA means bf16 compute with fp32 master weights (the masters are what a save writes).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/cuda_check.h"
#include "train/cuda/cuda_train_step.h"
#include "train/memory_plan.h"
#include "train/train_checkpoint.h"
#include "train/train_engine.h"

namespace mt {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every host parameter uploaded as BF16 (rounded to nearest even when the host holds F32).
Qwen3MoeWeights upload_bf16(const Qwen3MoeConfig& cfg, const Qwen3MoeWeights& host, int device) {
  Qwen3MoeWeights d = Qwen3MoeWeights::empty_like_config(cfg, DType::BF16, Device::cuda(device));
  auto src = host.named_parameters();
  auto dst = d.named_parameters();
  for (size_t i = 0; i < src.size(); ++i) {
    const Tensor& h = *src[i].second;
    cuda::copy_host_to_device(*dst[i].second, h.dtype() == DType::BF16 ? h : h.to(DType::BF16));
  }
  return d;
}

CudaTrainStepOptions step_options(const Recipe& r) {
  CudaTrainStepOptions o;
  o.model.recompute = recompute_parse(r.train.recompute, "train.recompute");
  o.adamw.hyper = adamw_options_from(r);
  o.adamw.bf16_master = o.adamw.hyper.master_weights;
  o.adamw.moment_dtype = r.optimizer.moment_dtype == "bfloat16" ? DType::BF16 : DType::F32;
  o.adamw.seed = r.train.seed;
  o.expert_grad_dtype = r.optimizer.expert_grad_dtype == "bfloat16" ? DType::BF16 : DType::F32;
  if (!r.optimizer.decay_norms_and_biases) o.decays = adamw_hf_decays;
  return o;
}

// Prints the plan; refuses what cannot fit. Returns whether to pair expert wgrads (pairing_wanted).
bool plan_memory(const Qwen3MoeConfig& cfg, const Recipe& r, int device, std::FILE* log) {
  size_t free_b = 0, total_b = 0;
  MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  MemoryPlanInput in;
  in.cfg = cfg;
  in.micro_batch = r.train.micro_batch_size;
  in.seq = r.data.seq_len;
  in.recompute = recompute_parse(r.train.recompute, "train.recompute");
  in.fp32_master = r.optimizer.master_weights == "float32";
  in.bf16_moments = r.optimizer.moment_dtype == "bfloat16";
  in.bf16_expert_grads = r.optimizer.expert_grad_dtype == "bfloat16";
  in.device_bytes = static_cast<int64_t>(total_b);
  // The CUDA context and cuBLASLt live outside the allocator; keep 1.5 GiB + 3% free for them.
  in.reserve_bytes = (int64_t{3} << 29) + static_cast<int64_t>(total_b) * 3 / 100;
  const bool pair = pairing_wanted(in, r.train.grad_accum);
  in.pair_expert_wgrad = pair;
  const MemoryPlan p = memory_plan(in);
  if (log) std::fprintf(log, "%s\n", p.table().c_str());
  if (!p.fits) fail("cuda:{}: {}", device, p.refusal());
  return pair;
}

class CudaEngine final : public TrainEngine {
 public:
  CudaEngine(CausalLM& lm, const Recipe& r, int device, std::FILE* log)
      : lm_(lm), device_(device), host_f32_(lm.weights.embed.dtype() == DType::F32) {
    if (host_f32_ && r.optimizer.master_weights != "float32")
      fail("model.dtype float32 with optimizer.master_weights none: on CUDA the model computes in bf16 and "
           "float32 means fp32 master weights; set optimizer.master_weights: float32 or model.dtype: bfloat16");
    cuda::device_set(device_);
    const bool pair = plan_memory(lm.config, r, device_, log);
    cuda::allocator_reset_peak(device_);
    weights_ = upload_bf16(lm.config, lm.weights, device_);
    CudaTrainStepOptions so = step_options(r);
    so.pair_expert_wgrad = pair;
    step_ = std::make_unique<CudaTrainStep>(lm.config, weights_, device_, so);
    if (host_f32_) masters_from_host();
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = fmt::format("cuda:{} ({})", device_, prop.name);
  }

  std::string device_name() const override { return name_; }

  EngineStep step(const std::vector<Batch>& window, double ce_divisor, double lr, double max_grad_norm) override {
    std::vector<CudaBatch> gpu;
    for (const Batch& b : window) gpu.push_back(cuda_batch_upload(lm_.config, b, device_));
    return step_->step(gpu, ce_divisor, lr, max_grad_norm);
  }

  EngineEval eval(const Batch& b) override { return step_->eval(cuda_batch_upload(lm_.config, b, device_)); }

  int64_t optimizer_steps() const override { return step_->optimizer().step_count(); }
  void set_optimizer_steps(int64_t t) override { step_->optimizer().set_step_count(t); }

  void weights_to_host() override {
    if (host_f32_) {
      for (auto& [name, t] : step_->optimizer().named_state())
        if (ends_with(name, ".master")) cuda::copy_device_to_host(*host_param(name.substr(0, name.size() - 7)), *t);
      return;
    }
    auto src = weights_.named_parameters();
    auto dst = lm_.weights.named_parameters();
    for (size_t i = 0; i < src.size(); ++i) cuda::copy_device_to_host(*dst[i].second, *src[i].second);
  }

  std::vector<std::pair<std::string, Tensor>> optimizer_state_host() override {
    std::vector<std::pair<std::string, Tensor>> r;
    for (auto& [name, t] : step_->optimizer().named_state()) r.emplace_back(name, cuda::to_host(*t));
    return r;
  }

  void optimizer_state_load(const std::string& dir) override {
    auto state = step_->optimizer().named_state();
    std::vector<Tensor> host;
    host.reserve(state.size());
    std::vector<std::pair<std::string, Tensor*>> targets;
    for (auto& [name, t] : state) {
      host.push_back(Tensor::empty(t->shape(), t->dtype()));
      targets.emplace_back(name, &host.back());
    }
    optimizer_state_read(dir, targets);
    for (size_t i = 0; i < state.size(); ++i) cuda::copy_host_to_device(*state[i].second, host[i]);
  }

  int64_t peak_memory_bytes() const override { return cuda::allocator_stats(device_).peak_allocated_bytes; }
  int64_t peak_reserved_bytes() const override { return cuda::allocator_stats(device_).peak_reserved_bytes; }

 private:
  Tensor* host_param(const std::string& name) {
    for (auto& [n, t] : lm_.weights.named_parameters())
      if (n == name) return t;
    fail("optimizer state names an unknown parameter '{}'", name);
  }

  // fp32 masters start from the host's fp32 values, not from their bf16 rounding.
  void masters_from_host() {
    for (auto& [name, t] : step_->optimizer().named_state())
      if (ends_with(name, ".master")) cuda::copy_host_to_device(*t, *host_param(name.substr(0, name.size() - 7)));
  }

  CausalLM& lm_;
  int device_;
  bool host_f32_;
  std::string name_;
  Qwen3MoeWeights weights_;
  std::unique_ptr<CudaTrainStep> step_;
};

// Registers the engine with the trainer when the CUDA library is linked in.
const bool kRegistered = [] {
  cuda_engine_register({[] { return cuda::device_count(); },
                        [](const Qwen3MoeConfig& cfg) { return cuda_model_unsupported_reason(cfg); },
                        [](CausalLM& lm, const Recipe& r, int device, std::FILE* log) -> std::unique_ptr<TrainEngine> {
                          return std::make_unique<CudaEngine>(lm, r, device, log);
                        }});
  return true;
}();

}  // namespace

}  // namespace mt
