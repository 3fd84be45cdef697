// The CUDA engine for LoRA (recipe `peft`; the CPU twin is train/lora_engine.h): the base uploaded once as bf16 and
// frozen on the GPU, the adapter's fp32 masters and bf16 working copies there (models/cuda/cuda_lora.h), the step
// CudaTrainStep with CudaTrainStepOptions::lora (AdamW, norm and clipping over the adapter and the full-trained
// targets only). One process, one GPU (the trainer refuses ranks and expert parallelism with LoRA first).
// Checkpoints hold what the CPU LoRA engine's hold: the adapter in PEFT's files, optimizer.safetensors with the same
// tensor names and dtypes (fp32 moments; a bf16 router's fp32 master), so either engine resumes the other's run
// (unless optimizer.moment_dtype is bfloat16, which the CPU engine refuses).
#pragma once
#include <cstdio>
#include <memory>

#include "models/causal_lm.h"
#include "models/lora_adapter.h"
#include "train/recipe.h"
#include "train/train_engine.h"

namespace mt {

// lm and the adapter's table must outlive the engine; the engine keeps `adapter` (F32 on the host: TrainEngine::lora(),
// brought up to date by weights_to_host()).
std::unique_ptr<TrainEngine> cuda_lora_engine_create(CausalLM& lm, const Recipe& r, LoraWeights adapter, int device,
                                                     std::FILE* log);

}  // namespace mt
