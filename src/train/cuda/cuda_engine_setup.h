// What the CUDA training engines (full training: cuda_engine.cpp; LoRA: cuda_lora_engine.cpp) set up alike: the
// recipe as step options, the memory plan's input from the recipe and the device, the plan printed and checked,
// and the host parameters uploaded as bf16.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "models/model_weights.h"
#include "models/spec/decoder_spec.h"
#include "train/cuda/cuda_train_step.h"
#include "train/memory_plan.h"
#include "train/optimizer_shards.h"
#include "train/recipe.h"

namespace mt {

// The rows of a host parameter this rank holds: all of it, or under expert parallelism its experts' slice.
struct ExpertSlice {
  int64_t first = 0, count = -1;  // count < 0: every expert
  std::shared_ptr<const ParamTable> params;  // which parameters are expert stacks (with count >= 0)
  Tensor of(const std::string& name, const Tensor& host) const {
    return count >= 0 && params->is_expert_stack(name) ? host.rows(first, first + count) : host;
  }
};

// Every host parameter (this rank's slice) uploaded as BF16 (rounded to nearest even when the host holds F32).
// Under ZeRO-3 the parameters another rank owns stay absent (train/sharded_params.h): never allocated here.
ModelWeights cuda_upload_bf16(const DecoderSpec& cfg, const ModelWeights& host, int device, const ExpertSlice& sl,
                              const OptimizerShards* params_owned);

// The recipe's train and optimizer sections as step options (no collectives, shards or adapter yet).
CudaTrainStepOptions cuda_step_options(const Recipe& r);

// The memory plan's input for one GPU of the run: the recipe's shapes and precision, the current device's memory
// (cuda::device_set first); ep: expert-parallel ranks, world: the job's ranks. Expert wgrads not paired
// (pairing_wanted decides).
MemoryPlanInput cuda_memory_plan_input(const DecoderSpec& cfg, const Recipe& r, int64_t ep, int64_t world);
// Prints the plan to log (when not null); refuses what cannot fit (one line naming cuda:device).
void cuda_memory_plan_check(const MemoryPlanInput& in, int device, std::FILE* log);

// dev into host (same shape), converting the dtype when they differ (bf16 on the device, f32 on the host).
void cuda_copy_to_host_converting(const Tensor& dev, Tensor& host);

}  // namespace mt
