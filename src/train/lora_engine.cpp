#include "train/lora_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/memory.h"
#include "models/lora_checkpoint.h"
#include "train/adamw.h"
#include "train/expert_load.h"
#include "train/grad_clip.h"
#include "train/train_checkpoint.h"

namespace mt {
namespace {

class CpuLoraEngine final : public TrainEngine {
 public:
  CpuLoraEngine(CausalLM& lm, const Recipe& r, LoraWeights adapter)
      : lm_(lm), adapter_(std::move(adapter)), loads_(ExpertLoads::zeros(lm.config)),
        model_(lm.config, lm.weights, model_options(adapter_, loads_)),
        base_grads_(lora_base_grads(lm.config, *adapter_.table)),
        lora_grads_(LoraWeights::zeros(adapter_.table, lm.config.num_layers())),
        optimizer_(trainable(lm, adapter_), adamw_options_from(r),
                   r.optimizer.decay_norms_and_biases ? std::function<bool(const std::string&)>() : adamw_hf_decays) {
    if (r.optimizer.moment_dtype != "float32")
      fail("optimizer.moment_dtype: '{}' is supported on CUDA only (the CPU optimizer keeps float32 moments)",
           r.optimizer.moment_dtype);
    expert_bias_recipe_check(r, lm.config);  // refuses a bias update: the base is frozen
    for (auto& [name, g] : lora_grads_.named_parameters()) grads_.push_back(g);
    for (const std::string& name : adapter_.table->full) grads_.push_back(&base_grads_.slot(*table().find(name)));
    grads_const_.assign(grads_.begin(), grads_.end());
    memory_reset_peak(Device::cpu());
  }

  std::string device_name() const override { return "cpu"; }

  EngineStep step(const std::vector<Batch>& window, double ce_divisor, double lr, double max_grad_norm) override {
    for (Tensor* g : grads_) std::memset(g->data(), 0, g->nbytes());
    if (!loads_.empty()) loads_.flat.fill_zero();
    LossOptions lo;
    lo.ce_divisor = ce_divisor;
    EngineStep s;
    for (const Batch& b : window) {
      const ForwardResult f = model_.forward_backward(b, base_grads_, lora_grads_, lo);
      s.loss += f.loss;
      s.ce_loss += f.ce_loss;
      s.aux_loss += f.aux_loss;
    }
    if (!window.empty()) s.aux_loss /= static_cast<double>(window.size());
    s.expert_load_max_over_mean = expert_loads_max_over_mean(loads_);  // the metric only: the base stays frozen
    s.grad_norm = grad_global_norm(grads_);
    s.finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
    if (s.finite) {
      grad_clip_to(grads_, s.grad_norm, max_grad_norm);
      optimizer_.step(grads_const_, lr);
    }
    return s;
  }

  EngineEval eval(const Batch& b) override {
    LossOptions o;
    o.ce_divisor = 1;
    const ForwardResult f = model_.forward(b, false, o);
    return {f.ce_loss, f.aux_loss, f.tokens};
  }

  int64_t optimizer_steps() const override { return optimizer_.step_count(); }
  void set_optimizer_steps(int64_t t) override { optimizer_.set_step_count(t); }
  void weights_to_host() override {}
  std::vector<std::pair<std::string, Tensor>> optimizer_state_host() override {
    std::vector<std::pair<std::string, Tensor>> r;
    for (auto& [name, t] : optimizer_.named_state()) r.emplace_back(name, *t);
    return r;
  }
  void optimizer_state_load(const std::string& dir) override { optimizer_state_read(dir, optimizer_); }
  const OptimizerShards& optimizer_shards() const override { return shards_; }
  int64_t optimizer_state_bytes() override {
    int64_t b = 0;
    for (auto& [name, t] : optimizer_.named_state()) b += static_cast<int64_t>(t->nbytes());
    return b;
  }
  int64_t peak_memory_bytes() const override { return memory_stats(Device::cpu()).peak_bytes; }
  int64_t peak_reserved_bytes() const override { return peak_memory_bytes(); }
  LoraWeights* lora() override { return &adapter_; }

 private:
  const ParamTable& table() const { return lm_.weights.param_table(); }
  static ModelOptions model_options(const LoraWeights& adapter, ExpertLoads& loads) {
    ModelOptions o;
    o.lora = &adapter;
    if (!loads.empty()) o.expert_load = &loads.layers;
    return o;
  }
  // The adapter's tensors, then the full-trained base parameters, in table order.
  static std::vector<std::pair<std::string, Tensor*>> trainable(CausalLM& lm, LoraWeights& adapter) {
    std::vector<std::pair<std::string, Tensor*>> r = adapter.named_parameters();
    for (const std::string& name : adapter.table->full) {
      const ParamEntry* e = lm.weights.param_table().find(name);
      MT_CHECK(e != nullptr, "LoRA: full-trained {} is not a parameter", name);
      r.emplace_back(name, &lm.weights.slot(*e));
    }
    return r;
  }

  CausalLM& lm_;
  LoraWeights adapter_;
  ExpertLoads loads_;  // this step's routed slots per expert and MoE layer (metrics only)
  DecoderModel model_;
  ModelWeights base_grads_;  // undefined but for the full-trained parameters
  LoraWeights lora_grads_;
  AdamW optimizer_;
  OptimizerShards shards_;  // none
  std::vector<Tensor*> grads_;  // optimizer order
  std::vector<const Tensor*> grads_const_;
};

}  // namespace

LoraConfig lora_config_from(const RecipePeft& p) {
  LoraConfig c;
  c.r = p.r;
  c.alpha = p.alpha;
  c.use_rslora = p.use_rslora;
  c.target = p.target;
  return c;
}

std::string lora_gpu_unsupported(const Recipe& r, const DecoderSpec& spec, const std::string& resume_dir) {
  const std::string saved = !resume_dir.empty() ? resume_dir : r.model.adapter;
  const LoraTable t = lora_table_of(spec, saved.empty() ? lora_config_from(r.peft) : lora_config_read(saved, spec),
                                    saved.empty() ? r.file : saved);
  if (t.config.r % 8 == 0) return "";
  for (const LoraEntry& e : t.entries)
    if (e.role == ParamRole::expert_stack)
      return fmt::format("peft.r {} on expert stacks is not a multiple of 8, which the GPU's grouped GEMMs need (their "
                         "16-byte rows); use 8, 16, 32, ...",
                         t.config.r);
  return "";
}

LoraWeights lora_adapter_for_run(const Recipe& r, CausalLM& lm, const std::string& resume_dir) {
  const std::string saved = !resume_dir.empty() ? resume_dir : r.model.adapter;
  if (saved.empty()) {
    auto table = std::make_shared<const LoraTable>(lora_table_of(lm.config, lora_config_from(r.peft), r.file));
    return LoraWeights::init(table, lm.config.num_layers(), r.train.seed);
  }
  LoraWeights w = lora_load_pretrained(saved, lm.config, lm.weights);
  if (!r.peft.target.empty()) {  // the recipe's peft section gives settings too: they must be the adapter's
    const LoraConfig want = lora_config_from(r.peft), have = w.table->config;
    auto differ = [&](const char* field, const std::string& a, const std::string& b) {
      if (a != b)
        fail("{}: peft.{}: {} in the recipe, {} in the adapter {}", r.file, field, a, b, saved);
    };
    differ("r", std::to_string(want.r), std::to_string(have.r));
    differ("alpha", fmt::format("{}", want.alpha), fmt::format("{}", have.alpha));
    differ("use_rslora", want.use_rslora ? "true" : "false", have.use_rslora ? "true" : "false");
    std::vector<std::string> a = want.target, b = have.target;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    differ("target", fmt::format("[{}]", fmt::join(a, ", ")), fmt::format("[{}]", fmt::join(b, ", ")));
  }
  return w;
}

std::unique_ptr<TrainEngine> cpu_lora_engine_create(CausalLM& lm, const Recipe& r, LoraWeights adapter) {
  return std::make_unique<CpuLoraEngine>(lm, r, std::move(adapter));
}

}  // namespace mt
