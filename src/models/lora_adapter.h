// A LoRA adapter over a decoder model (PEFT's LoRA, peft/tuners/lora): which base weights it adapts, its A/B
// tensors in the engines' layout, and PEFT's init. Every adapted weight W [out, in] gets A [r, in] and B [out, r],
// y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ with s = alpha / r (alpha / √r with rsLoRA); an expert stack [E, out, in] gets one pair
// per expert, stacked as A [E, r, in] and B [E, out, r] (expert parallelism splits dim 0, like the base stack).
// The base stays frozen; the adapter is fp32 whatever the base dtype (PEFT's autocast_adapter_dtype default).
// PEFT's file layout (adapter_model.safetensors names, its per-expert packing) is converted in train/lora_io.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/lora.h"
#include "models/model_weights.h"
#include "models/param_table.h"
#include "models/spec/decoder_spec.h"

namespace mt {

// The adapter's hyper-parameters: the recipe's `peft` section, or a saved adapter_config.json.
struct LoraConfig {
  int64_t r = 16;
  double alpha = 32;
  bool use_rslora = false;
  std::vector<std::string> target;  // the family's target names (models/spec/lora_targets.h)
  double scaling() const;           // alpha / r, or alpha / sqrt(r) with use_rslora (PEFT's update_layer)
};

// One adapter tensor.
struct LoraEntry {
  std::string name;  // engine name: the base module's name + ".lora_A.weight" / ".lora_B.weight"
  std::string base;  // the adapted parameter's table name
  std::string target;  // the family's target name that adapts it (LoraTargetDef::name: "in_proj", "experts")
  Shape shape;       // A [r, in] | B [out, r]; an expert stack's: [E, r, in] | [E, out, r]
  ParamRole role = ParamRole::replicated;  // replicated | expert_stack
  int64_t layer = -1;
  int slot = -1;      // the base weight's WeightSlot
  bool is_b = false;  // A or B
  int64_t in = 0, out = 0;
  // Transformers' layout interleaves this stack's gate and up outputs (LoraTargetDef::interleaved_gate_up); the
  // engines' B rows are gate rows then up rows.
  bool interleaved_out = false;
  // PEFT adapts it as a parameter (lora.ParamWrapper: an expert stack, or a target the family spells in
  // target_parameters, LoraTargetDef::peft_as_parameter): its merge casts Δ to W's dtype before the add.
  bool peft_parameter = false;
};

// Every adapter tensor of a model, in the base table's order (A before B for each adapted weight), and the base
// parameters that train in full (target `router`).
struct LoraTable {
  LoraConfig config;
  int64_t num_experts = 0;  // E of the expert stacks
  std::vector<LoraEntry> entries;
  std::vector<std::string> full;  // base parameter names trained in full, table order
  const LoraEntry* find(const std::string& name) const;  // nullptr when absent
};

// The adapter of `config` over `spec`'s model. Throws a one-line mt::Error naming `source` and the field
// (peft.r, peft.alpha, peft.target) for r <= 0, alpha <= 0, an empty target list, a name the family does not
// know (listing those it knows), a name listed twice, or one that matches nothing in this model.
LoraTable lora_table_of(const DecoderSpec& spec, const LoraConfig& config, const std::string& source);

// Trainable adapter parameters (A and B; the full-trained base parameters are counted by the base table).
int64_t lora_parameter_count(const LoraTable& t);

// One adapted weight's pair (undefined tensors: that slot has no adapter).
struct LoraPair {
  Tensor a, b;
  bool on() const { return a.defined(); }
};

// A layer's adapters, one pair per adaptable slot, and the scaling they share. The same struct holds gradients.
struct LayerLora {
  LoraPair q_proj, k_proj, v_proj, o_proj;
  LoraPair mlp_gate, mlp_up, mlp_down;
  LoraPair experts_gate_up, experts_down;
  LoraPair q_a_proj, q_b_proj, kv_a_proj, kv_b_proj;  // MLA (DeepSeek-V3)
  LoraPair shared_gate, shared_up, shared_down;       // the shared expert
  LoraPair mamba_in_proj, mamba_out_proj;             // the Mamba2 mixer's projections (Nemotron-H)
  float scale = 0.0f;

  LoraPair* at(int slot);  // nullptr for a slot LoRA does not adapt
  const LoraPair* at(int slot) const;
  // What the kernels read: the pair of `slot` with the scale (off when absent).
  cpu::LoraRef ref(int slot) const;
  cpu::LoraGradRef grad(int slot);
};

struct LoraWeights {
  std::shared_ptr<const LoraTable> table;
  std::vector<LayerLora> layers;

  Tensor& slot(const LoraEntry& e);
  const Tensor& slot(const LoraEntry& e) const;
  // A and B of every entry, table order (optimizer, clipping, checkpoint order).
  std::vector<std::pair<std::string, Tensor*>> named_parameters();
  std::vector<std::pair<std::string, const Tensor*>> named_parameters() const;

  // PEFT's init (LoraLayer.reset_lora_parameters, init_lora_weights=True): A kaiming_uniform_(a=√5), i.e.
  // U(-1/√in, 1/√in) (fan_in = in, also for an expert stack's packed [r·E, in] lora_A); B zeros, so the adapted
  // model starts equal to the base. Seeded, one RNG stream per name (not torch's numbers).
  static LoraWeights init(std::shared_ptr<const LoraTable> table, int64_t num_layers, uint64_t seed);
  // Zero-filled, F32 (gradients; or a buffer to load into).
  static LoraWeights zeros(std::shared_ptr<const LoraTable> table, int64_t num_layers);
};

// Merges the adapter into the base (PEFT's merge_and_unload): every adapted W [out, in] (each expert's, for a
// stack) becomes W + Δ, Δ = s·B·A computed as PEFT's get_delta_weight does (B·A in fp32, then ·s). F32 W: one fp32
// add. BF16 W: an nn.Linear target adds the fp32 Δ and rounds once; an expert stack (PEFT's ParamWrapper) rounds Δ to
// bf16 first, then the sum. The base tensors must hold every expert (not an expert-parallel slice).
void lora_merge_into(ModelWeights& base, const LoraWeights& lora);

// Gradient buffers for the base under LoRA: zero F32 tensors for the parameters that train in full
// (table.full), undefined (frozen: no gradient is computed) for every other one.
ModelWeights lora_base_grads(const DecoderSpec& spec, const LoraTable& table);

}  // namespace mt
