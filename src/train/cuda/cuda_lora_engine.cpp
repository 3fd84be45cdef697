#include "train/cuda/cuda_lora_engine.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "models/cuda/cuda_lora.h"
#include "train/cuda/cuda_engine_setup.h"
#include "train/cuda/cuda_train_step.h"
#include "train/expert_load.h"
#include "train/memory_plan.h"
#include "train/train_checkpoint.h"

namespace mt {

namespace {

bool is_master(const std::string& state_name) {
  const std::string suffix = ".master";
  return state_name.size() > suffix.size() &&
         state_name.compare(state_name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class CudaLoraEngine final : public TrainEngine {
 public:
  CudaLoraEngine(CausalLM& lm, const Recipe& r, LoraWeights adapter, int device, std::FILE* log)
      : lm_(lm), device_(device), host_f32_(lm.weights.embed.dtype() == DType::F32), adapter_(std::move(adapter)) {
    if (host_f32_ && r.optimizer.master_weights != "float32")
      fail("model.dtype float32 with optimizer.master_weights none: on CUDA the model computes in bf16 and "
           "float32 means fp32 master weights; set optimizer.master_weights: float32 or model.dtype: bfloat16");
    expert_bias_recipe_check(r, lm.config);  // refuses a bias update: the base is frozen
    cuda::device_set(device_);
    MemoryPlanInput in = cuda_memory_plan_input(lm.config, r, /*ep=*/1, /*world=*/1);
    memory_plan_set_lora(in, *adapter_.table, /*gpu=*/true);  // frozen experts: no wgrads to pair
    cuda_memory_plan_check(in, device_, log);
    cuda::allocator_reset_peak(device_);
    weights_ = cuda_upload_bf16(lm.config, lm.weights, device_, ExpertSlice{}, nullptr);
    lora_ = std::make_unique<CudaLora>(adapter_, device_);
    CudaTrainStepOptions so = cuda_step_options(r);
    so.lora = lora_.get();
    step_ = std::make_unique<CudaTrainStep>(lm.config, weights_, device_, so);
    // An fp32 host: the full-trained parameters' masters start from its fp32 values, not from their bf16 rounding
    // (after a resume: the values the saved adapter holds, lora_load_pretrained having put them into lm).
    if (host_f32_)
      for (auto& [name, t] : step_->optimizer().named_state())
        if (is_master(name)) cuda::copy_host_to_device(*t, host_param(name.substr(0, name.size() - 7)));
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

  // The adapter's masters into adapter_, the full-trained parameters into lm (fp32 host: their masters; else the
  // bf16 parameters, which are bf16(master) when there is one).
  void weights_to_host() override {
    lora_->to_host(adapter_);
    for (const std::string& name : adapter_.table->full) {
      Tensor& host = host_param(name);
      if (host_f32_)
        cuda_copy_to_host_converting(*state(name + ".master"), host);
      else
        cuda_copy_to_host_converting(weights_.slot(*weights_.param_table().find(name)), host);
    }
  }

  // As the CPU LoRA engine's: "<name>.exp_avg|exp_avg_sq" of the adapter and the full-trained parameters, and
  // ".master" of a bf16 full-trained parameter. On an fp32 host the master is the parameter the adapter's files save
  // (weights_to_host), as the CPU engine's fp32 router is: not written again here.
  std::vector<std::pair<std::string, Tensor>> optimizer_state_host() override {
    std::vector<std::pair<std::string, Tensor>> r;
    for (auto& [name, t] : saved_state()) r.emplace_back(name, cuda::to_host(*t));
    return r;
  }

  void optimizer_state_load(const std::string& dir) override {
    const auto state = saved_state();
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

  const OptimizerShards& optimizer_shards() const override { return step_->shards(); }
  int64_t optimizer_state_bytes() override { return step_->optimizer_state_bytes(); }
  int64_t peak_memory_bytes() const override { return cuda::allocator_stats(device_).peak_allocated_bytes; }
  int64_t peak_reserved_bytes() const override { return cuda::allocator_stats(device_).peak_reserved_bytes; }
  LoraWeights* lora() override { return &adapter_; }

 private:
  Tensor& host_param(const std::string& name) {
    const ParamEntry* e = lm_.weights.param_table().find(name);
    MT_CHECK(e != nullptr, "LoRA: {} is not a parameter of the model", name);
    return lm_.weights.slot(*e);
  }

  Tensor* state(const std::string& name) {
    for (auto& [n, t] : step_->optimizer().named_state())
      if (n == name) return t;
    fail("LoRA: the optimizer has no state '{}'", name);
  }

  std::vector<std::pair<std::string, Tensor*>> saved_state() {
    std::vector<std::pair<std::string, Tensor*>> r;
    for (auto& [name, t] : step_->optimizer().named_state())
      if (!(host_f32_ && is_master(name))) r.emplace_back(name, t);
    return r;
  }

  CausalLM& lm_;
  int device_;
  bool host_f32_;
  std::string name_;
  LoraWeights adapter_;  // F32 on the host
  ModelWeights weights_;  // the base, BF16 on the device
  std::unique_ptr<CudaLora> lora_;
  std::unique_ptr<CudaTrainStep> step_;
};

}  // namespace

std::unique_ptr<TrainEngine> cuda_lora_engine_create(CausalLM& lm, const Recipe& r, LoraWeights adapter, int device,
                                                     std::FILE* log) {
  return std::make_unique<CudaLoraEngine>(lm, r, std::move(adapter), device, log);
}

}  // namespace mt
