// The names a recipe's `peft.target` may list for a family (each family file declares its own): a name stands for
// weight slots of the layers (models/model_weights.h WeightSlot) that get LoRA adapters, or that train in full
// (the router: an adapter on a [E, H] router weight would be most of the weight anyway).
#pragma once
#include <string>
#include <vector>

namespace mt {

struct LoraTargetDef {
  std::string name;        // recipe spelling, as PEFT's target_modules would name the module: "q_proj", "experts"
  std::vector<int> slots;  // WeightSlot members it covers, in any layer that has them
  bool full = false;       // true: those parameters train in full (no adapter), as PEFT's modules_to_save
  // Transformers holds the fused expert gate_up stack with gate and up interleaved along the output (GPT-OSS:
  // gate = even rows), while the engines hold gate rows then up rows: a saved lora_B's output rows are reordered.
  bool interleaved_gate_up = false;
};

}  // namespace mt
