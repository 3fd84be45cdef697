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
  // Saved in PEFT's target_parameters (the 2-D weight, "mlp.down_proj.weight") instead of target_modules: PEFT >=
  // 0.19 rewrites the target_modules gate_proj / up_proj / down_proj of a model type Transformers v5 converts
  // (qwen3_moe) into its fused expert parameters, which would leave a dense layer's MLP unadapted. Same tensor
  // names and function (a ParamWrapper of one "expert": W + s·B·A).
  bool peft_as_parameter = false;
  // Non-empty: a module PEFT refuses to adapt for this model type (why, one line): named in a recipe or an adapter
  // config, it is an error with this reason rather than an unknown target.
  std::string refused = {};
};

}  // namespace mt
