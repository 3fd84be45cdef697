// Which LoRA adapters the CUDA engine applies (models/cuda, layers/cuda): every adapted slot but the Mamba2 mixer's
// in_proj and out_proj, whose CUDA block (layers/cuda/mamba2_mixer_block_cuda.cpp) runs the base projections only.
// Compiled in every build, so the trainer can refuse before any GPU work and tests run without a GPU; the CUDA model
// checks it again, so no adapter is ever trained silently without effect.
#pragma once
#include <string>

#include "models/lora_adapter.h"

namespace mt {

// Why the CUDA engine cannot apply `t`'s adapters, one line naming the first such target; "" when it can.
std::string lora_cuda_unsupported(const LoraTable& t);

}  // namespace mt
