#include "models/lora_cuda_support.h"

#include <fmt/format.h>

#include "models/model_weights.h"

namespace mt {

std::string lora_cuda_unsupported(const LoraTable& t) {
  for (const LoraEntry& e : t.entries)
    if (e.slot == WeightSlot::mamba_in_proj || e.slot == WeightSlot::mamba_out_proj)
      return fmt::format("peft.target '{}': the CUDA engine's Mamba2 mixer applies no LoRA adapter to its {} yet",
                         e.target, e.slot == WeightSlot::mamba_in_proj ? "in_proj" : "out_proj");
  return "";
}

}  // namespace mt
