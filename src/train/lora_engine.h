// The CPU engine for LoRA (recipe `peft`): the base model frozen (no gradients, moments or master copies for it:
// its gradient buffers are left undefined, so the blocks skip its weight-gradient GEMMs), AdamW and gradient
// clipping over the adapter's A/B tensors and the parameters of full-trained targets (the router) only. One
// process, no expert parallelism and no sharded parameters (the trainer refuses those with LoRA first).
#pragma once
#include <memory>

#include "models/causal_lm.h"
#include "models/lora_adapter.h"
#include "train/recipe.h"
#include "train/train_engine.h"

namespace mt {

// The adapter a LoRA run trains on lm's model: the one in `resume_dir` (a checkpoint being resumed, which also
// restores the full-trained parameters into lm), else model.adapter (likewise), else a fresh one (PEFT's init, seeded
// by train.seed). Its settings come from the recipe's peft section or the saved adapter_config.json; when both
// give them they must agree (one-line error naming the field).
LoraWeights lora_adapter_for_run(const Recipe& r, CausalLM& lm, const std::string& resume_dir);
// The recipe's peft section as an adapter config (targets as listed).
LoraConfig lora_config_from(const RecipePeft& p);
// Why the CUDA engine cannot train the run's adapter on `spec`'s model (its settings as lora_adapter_for_run takes
// them: the adapter in resume_dir, else model.adapter, else the peft section), or "": an expert stack's r must be a
// multiple of 8 there (the grouped GEMMs' 16-byte rows). Every target the families take has a CUDA path (each
// adaptable slot of LayerLora is applied by its CUDA block).
std::string lora_gpu_unsupported(const Recipe& r, const DecoderSpec& spec, const std::string& resume_dir);

// lm and the adapter's table must outlive the engine; the engine keeps `adapter` (TrainEngine::lora()).
std::unique_ptr<TrainEngine> cpu_lora_engine_create(CausalLM& lm, const Recipe& r, LoraWeights adapter);

}  // namespace mt
