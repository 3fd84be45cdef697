// The CUDA training engine (train/train_engine.h): the CausalLM stays the host copy that checkpoints
// are written from; the GPU holds BF16 parameters, FP32 gradients and the AdamW state. model.dtype
// float32 on CUDA means bf16 compute with fp32 master weights (the masters are what a save writes).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "distributed/communicator.h"
#include "train/cuda/cuda_job_collectives.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/cuda_check.h"
#include "train/cuda/cuda_engine_setup.h"
#include "train/cuda/cuda_lora_engine.h"
#include "train/cuda/cuda_param_transport.h"
#include "train/cuda/cuda_train_step.h"
#include "train/expert_load.h"
#include "train/memory_plan.h"
#include "train/sharded_params.h"
#include "train/train_checkpoint.h"
#include "train/train_engine.h"

namespace mt {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Prints the plan; refuses what cannot fit. Returns whether to pair expert wgrads (pairing_wanted).
bool plan_memory(const DecoderSpec& cfg, const Recipe& r, int device, int64_t ep, int64_t world, std::FILE* log) {
  MemoryPlanInput in = cuda_memory_plan_input(cfg, r, ep, world);
  const bool pair = pairing_wanted(in, r.train.grad_accum);
  in.pair_expert_wgrad = pair;
  cuda_memory_plan_check(in, device, log);
  return pair;
}

class CudaEngine final : public TrainEngine {
 public:
  // comm: the job's host communicator when it has more than one rank (one GPU per rank), else null.
  CudaEngine(CausalLM& lm, const Recipe& r, int device, std::FILE* log, Communicator* comm)
      : lm_(lm), device_(device), host_f32_(lm.weights.embed.dtype() == DType::F32),
        bias_update_(r.moe.bias_update_rate > 0), log_(log) {
    if (host_f32_ && r.optimizer.master_weights != "float32")
      fail("model.dtype float32 with optimizer.master_weights none: on CUDA the model computes in bf16 and "
           "float32 means fp32 master weights; set optimizer.master_weights: float32 or model.dtype: bfloat16");
    expert_bias_recipe_check(r, lm.config);
    cuda::device_set(device_);
    CudaStepCollectives col;
    const bool ranks = comm && comm->size() > 1;
    if (ranks) col = join(*comm, r);
    const bool pair = plan_memory(lm.config, r, device_, ep_ ? ep_->ranks() : 1, comm ? comm->size() : 1, log);
    cuda::allocator_reset_peak(device_);
    if (ep_) slice_ = {ep_->first_expert(), ep_->experts_per_rank(), lm.weights.table};
    CudaTrainStepOptions so = cuda_step_options(r);
    so.pair_expert_wgrad = pair;
    so.collectives = col;
    // The owners depend on the parameters' names and element counts only (the expert stacks, the one thing
    // the slice changes, go by their per-expert size), so the host copy, which keeps all E rows, gives them.
    if (ranks && r.parallel.shard_optimizer)
      so.shards = optimizer_shards_for(lm.weights, comm->size(), comm->rank(), ep_ ? ep_->ranks() : 1);
    const bool shard_params = ranks && r.parallel.shard_parameters;
    weights_ = cuda_upload_bf16(lm.config, lm.weights, device_, slice_, shard_params ? &so.shards : nullptr);
    if (shard_params) {
      shards_ = so.shards;
      sharded_params_ = std::make_unique<ShardedParams>(
          weights_, lm.config, shards_, std::make_unique<CudaParamTransport>(*job_.world, device_, job_.replicas.get()),
          r.parallel.reshard_after_forward);
      so.model.residency = sharded_params_.get();
      so.params_sharded = true;
    }
    step_ = std::make_unique<CudaTrainStep>(lm.config, weights_, device_, so);
    if (sharded_params_) sharded_params_->shard();  // marks the groups absent (their tensors never came here)
    if (host_f32_) masters_from_host();
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = fmt::format("cuda:{} ({})", device_, prop.name);
    if (comm && comm->size() > 1)
      name_ += fmt::format(", rank {} of {}{}", comm->rank(), comm->size(),
                           ep_ ? fmt::format(", experts {}..{} of {}", slice_.first, slice_.first + slice_.count - 1,
                                             lm.config.num_experts())
                               : std::string());
  }

  std::string device_name() const override { return name_; }

  EngineStep step(const std::vector<Batch>& window, double ce_divisor, double lr, double max_grad_norm) override {
    ++steps_;
    stall_if_asked();
    std::vector<CudaBatch> gpu;
    for (const Batch& b : window) gpu.push_back(cuda_batch_upload(lm_.config, b, device_));
    const int64_t reruns = step_->reruns();
    EngineStep s = step_->step(gpu, ce_divisor, lr, max_grad_norm);
    if (step_->reruns() > reruns && log_ && writes_output())
      std::fprintf(log_,
                   "step %lld: expert rows passed their budget on some rank; the step ran again with exact row "
                   "counts (budget now %.3f of the even share)\n",
                   static_cast<long long>(steps_), ep_ ? ep_->row_budget().ratio() : 0.0);
    return s;
  }

  EngineEval eval(const Batch& b) override { return step_->eval(cuda_batch_upload(lm_.config, b, device_)); }

  int64_t optimizer_steps() const override { return step_->optimizer().step_count(); }
  void set_optimizer_steps(int64_t t) override { step_->optimizer().set_step_count(t); }

  // Each rank brings to the host what it writes of a save (train/shared_save.h): rank 0 every tensor that is
  // not split over ranks, the first expert-parallel group's ranks their experts' rows. Nothing is gathered.
  void weights_to_host() override {
    biases_to_host();
    if (host_f32_) {
      for (auto& [name, t] : step_->optimizer().named_state())
        if (ends_with(name, ".master")) to_host_own(name, *t, *host_param(name.substr(0, name.size() - 7)));
      return;
    }
    auto src = weights_.named_parameters();
    auto dst = lm_.weights.named_parameters();
    for (size_t i = 0; i < src.size(); ++i) to_host_own(src[i].first, *src[i].second, *dst[i].second);
  }

  // Full-shaped host tensors (untouched pages cost no memory), every parameter's in the unsharded order; this
  // rank's rows filled as in weights_to_host (a sharded-away parameter's state stays an unwritten placeholder).
  std::vector<std::pair<std::string, Tensor>> optimizer_state_host() override {
    std::vector<std::pair<std::string, Tensor>> r;
    for (StateSlot& s : state_layout()) {
      Shape full = s.spec.shape;
      if (slice_.count >= 0 && param_is_stacked_expert(lm_.weights.param_table(), s.spec.name))
        full[0] = lm_.config.num_experts();
      Tensor h = Tensor::empty(full, s.spec.dtype);
      if (s.held) to_host_own(s.spec.name, *s.held, h);
      r.emplace_back(s.spec.name, std::move(h));
    }
    return r;
  }

  // Each rank reads its share of the optimizer file: the non-expert tensors it updates, its own experts' rows.
  void optimizer_state_load(const std::string& dir) override {
    const auto total = static_cast<int64_t>(state_layout().size());
    auto state = step_->optimizer().named_state();
    std::vector<Tensor> host;
    host.reserve(state.size());
    std::vector<std::pair<std::string, Tensor*>> targets;
    for (auto& [name, t] : state) {
      host.push_back(Tensor::empty(t->shape(), t->dtype()));  // this rank's experts only
      targets.emplace_back(name, &host.back());
    }
    optimizer_state_read(dir, targets, &lm_.weights.param_table(), slice_.count >= 0 ? slice_.first : 0, slice_.count,
                         total);
    for (size_t i = 0; i < state.size(); ++i) cuda::copy_host_to_device(*state[i].second, host[i]);
  }

  const OptimizerShards& optimizer_shards() const override { return step_->shards(); }
  int64_t optimizer_state_bytes() override { return step_->optimizer_state_bytes(); }
  int64_t peak_memory_bytes() const override { return cuda::allocator_stats(device_).peak_allocated_bytes; }
  int64_t peak_reserved_bytes() const override { return cuda::allocator_stats(device_).peak_reserved_bytes; }

 private:
  // Fault injection for the failure-handling test (tests/train/cuda/cuda_multi_gpu_test.cpp):
  // MIXTUNE_TEST_STALL="RANK:STEP" makes that rank stop answering before that step's first collective, as a
  // hung process would; the other ranks must give up after parallel.timeout_s.
  void stall_if_asked() {
    const char* v = std::getenv("MIXTUNE_TEST_STALL");
    if (!v || !*v || !job_.world) return;
    int rank = -1;
    long step = -1;
    if (std::sscanf(v, "%d:%ld", &rank, &step) != 2 || rank != rank_ || step != steps_) return;
    std::this_thread::sleep_for(std::chrono::hours(1));
  }

  // The collectives of a multi-GPU job (train/cuda/cuda_job_collectives.h).
  CudaStepCollectives join(Communicator& comm, const Recipe& r) {
    rank_ = comm.rank();
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(r.parallel.timeout_s) * 1000);
    const EpDispatchMode dispatch = ep_dispatch_mode_parse(r.parallel.ep_dispatch, r.parallel.ep,
                                                           lm_.config.experts_per_token(), "parallel.ep_dispatch");
    job_ = cuda_job_collectives_create(comm, device_, timeout, r.parallel.ep, lm_.config.num_experts(), dispatch,
                                       "parallel.ep",
                                       device_collectives_parse(r.parallel.gpu_collectives, "parallel.gpu_collectives"));
    ep_ = job_.ep.get();
    if (ep_) ep_->set_row_headroom(r.parallel.ep_row_headroom);
    return job_.step();
  }

  bool writes_output() const { return rank_ == 0; }

  std::vector<StateSlot> state_layout() {
    return optimizer_state_layout(weights_.named_parameters(), step_->shards(), step_->optimizer().named_state(),
                                  [&](const std::string& n, const Tensor& p) {
                                    return cuda::CudaAdamW::state_specs(n, p, step_->optimizer().options());
                                  });
  }

  // dev (this rank's parameter or state tensor) into host (full shape), where this rank writes it: a sharded
  // parameter's (and its state's) owner — of an expert stack sharded over its replicas, its experts' rows —,
  // else rank 0 or the experts' rank (train/shared_save.h).
  void to_host_own(const std::string& name, const Tensor& dev, Tensor& host) {
    const std::string state_of = optimizer_state_param(name);
    const bool expert_rows = slice_.count >= 0 && param_is_stacked_expert(lm_.weights.param_table(), name);
    if (const int owner = step_->shards().owner(state_of.empty() ? name : state_of); owner >= 0) {
      if (owner != rank_) return;
    } else if (!expert_rows) {
      if (writes_output()) cuda_copy_to_host_converting(dev, host);
      return;
    } else if (rank_ >= ep_->ranks()) {
      return;  // a replica of the first group's experts: written there
    }
    if (!expert_rows) {
      cuda_copy_to_host_converting(dev, host);
      return;
    }
    Tensor own = host.rows(slice_.first, slice_.first + slice_.count);
    cuda_copy_to_host_converting(dev, own);
  }

  // The selection biases the aux-loss-free balancing moved (moe.bias_update_rate; fp32 buffers, the same on every
  // rank), where rank 0 writes them; nothing to do without the update.
  void biases_to_host() {
    if (!bias_update_ || !writes_output()) return;
    for (size_t l = 0; l < lm_.weights.layers.size(); ++l) {
      const Tensor& dev = weights_.layers[l].router_score_bias;
      Tensor& host = lm_.weights.layers[l].router_score_bias;
      if (dev.defined() && host.defined()) cuda::copy_device_to_host(host, dev);
    }
  }

  Tensor* host_param(const std::string& name) {
    for (auto& [n, t] : lm_.weights.named_parameters())
      if (n == name) return t;
    fail("optimizer state names an unknown parameter '{}'", name);
  }

  // fp32 masters start from the host's fp32 values, not from their bf16 rounding.
  void masters_from_host() {
    for (auto& [name, t] : step_->optimizer().named_state())
      if (ends_with(name, ".master")) {
        const std::string param = name.substr(0, name.size() - 7);
        cuda::copy_host_to_device(*t, slice_.of(param, *host_param(param)));
      }
  }

  CausalLM& lm_;
  int device_;
  bool host_f32_;
  bool bias_update_ = false;  // moe.bias_update_rate > 0
  std::FILE* log_ = nullptr;
  int rank_ = 0;
  int64_t steps_ = 0;  // step() calls in this process
  CudaJobCollectives job_;
  CudaExpertParallel* ep_ = nullptr;  // job_.ep
  ExpertSlice slice_;
  std::string name_;
  ModelWeights weights_;
  OptimizerShards shards_;                         // ZeRO-3's owners (sharded_params_ refers to them)
  std::unique_ptr<ShardedParams> sharded_params_;  // ZeRO-3 (train/sharded_params.h), or none
  std::unique_ptr<CudaTrainStep> step_;
};

// Registers the engine with the trainer when the CUDA library is linked in.
const bool kRegistered = [] {
  cuda_engine_register({[] { return cuda::device_count(); },
                        [](const DecoderSpec& cfg) { return cuda_model_unsupported_reason(cfg); },
                        [](CausalLM& lm, const Recipe& r, int device, std::FILE* log,
                           Communicator* comm) -> std::unique_ptr<TrainEngine> {
                          return std::make_unique<CudaEngine>(lm, r, device, log, comm);
                        },
                        [](CausalLM& lm, const Recipe& r, LoraWeights adapter, int device,
                           std::FILE* log) { return cuda_lora_engine_create(lm, r, std::move(adapter), device, log); }});
  return true;
}();

}  // namespace

}  // namespace mt
