// The parameter table of a model: every tensor the model holds, derived from its config in one place (the
// family file), in Transformers' named_parameters() order. Allocation, random init, checkpoint loading,
// weight checks, inspect's counts, the memory plan and bench's FLOPs all read it instead of listing the
// parameters again.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace mt {

// How the engines hold a tensor.
enum class ParamRole {
  replicated,    // every rank holds all of it
  expert_stack,  // [E, ...] stacked experts: expert parallelism splits dim 0 over ranks
  buffer,        // held and saved, not trained, not a parameter (DeepSeek-V3's e_score_correction_bias)
};

// What the model does with it: the counts (inspect, FLOPs) and the default init / decay rules read this.
enum class ParamUse {
  embedding,  // token embedding lookup (also the LM head when ParamTable::tied_embeddings)
  linear,     // a weight multiplied with every token's (or, in an expert stack, each routed token's) activations
  router,     // the MoE router's weight (a GEMM too, but not counted in bench's model FLOPs)
  norm,       // an RMSNorm weight
  bias,       // an additive bias
  sink,       // a learned per-head logit joining the attention softmax (GPT-OSS): normal init, decayed
  ssm,        // a Mamba2 scan or conv1d parameter that is no GEMM (conv1d.weight, A_log, D): decayed
  lm_head,    // the untied LM head
};

enum class ParamDType {
  model,  // the model's parameter dtype (F32 or BF16; gradients and moments pass F32)
  f32,    // always F32 (an fp32 buffer in a bf16 model)
};

enum class ParamInit {
  normal,  // normal(0, initializer_range)
  ones,
  zeros,
  a_log,    // log(1), log(2), ..., log(heads): Mamba2's A_log (A = −1, −2, ...)
  dt_bias,  // softplus⁻¹ of a log-uniform dt in [time_step_min, time_step_max], at least time_step_floor (Mamba2)
};

struct ParamEntry {
  std::string name;  // Transformers' in-memory name
  Shape shape;       // full shape (an expert stack's dim 0 is every expert)
  ParamRole role = ParamRole::replicated;
  ParamUse use = ParamUse::linear;
  ParamDType dtype = ParamDType::model;
  ParamInit init = ParamInit::normal;
  bool trainable = true;
  // HF Trainer's rule: norm weights and biases are not decayed (unless decay_norms_and_biases).
  bool decay = true;
  int64_t layer = -1;  // decoder layer, -1 for model-level tensors
  int slot = -1;       // where the family's weights struct holds it (the family's own numbering)
};

// A parameter with the default rules of its use: Transformers' init (norms 1, biases 0, the rest
// normal(0, initializer_range)) and HF Trainer's decay (none for norms and biases).
ParamEntry param_entry(std::string name, Shape shape, ParamUse use, ParamRole role = ParamRole::replicated);

class ParamTable {
 public:
  int64_t num_experts = 0;        // E of every expert stack (0: none)
  int64_t experts_per_token = 0;  // k routed experts per token
  bool tied_embeddings = false;   // the embedding is also the LM head (no lm_head entry)

  void add(ParamEntry e);  // names must be unique
  const std::vector<ParamEntry>& entries() const { return entries_; }
  const ParamEntry* find(const std::string& name) const;  // nullptr when absent
  // Whether `name` is an expert stack of this table (false for names it does not hold).
  bool is_expert_stack(const std::string& name) const;

 private:
  std::vector<ParamEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

DType param_dtype(const ParamEntry& e, DType model_dtype);
// The shape a holder of `experts_held` experts has (>= 0, expert stacks only; < 0: every expert).
Shape param_shape_held(const ParamEntry& e, int64_t experts_held);
// Elements of one expert of an expert stack (the whole tensor for other roles).
int64_t param_numel_per_expert(const ParamEntry& e);

// Parameter counts over the table (buffers excluded, as Transformers' num_parameters does).
struct ParamCounts {
  int64_t total = 0;
  int64_t experts = 0;    // in expert stacks
  int64_t active = 0;     // used per token: the expert stacks at k of E experts
  int64_t embedding = 0;  // the embedding, plus the untied LM head
  // Weights multiplied per token in forward (linear ones, expert stacks at k of E, the LM head): 2x this is a
  // token's forward GEMM FLOPs, attention scores excluded. The router is left out (bench's MFU convention).
  int64_t matmul_per_token = 0;
};
ParamCounts param_counts(const ParamTable& t);

const char* param_role_name(ParamRole r);

}  // namespace mt
