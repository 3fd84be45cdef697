// A family's checkpoint layout as data: how the tensors of a Hugging Face checkpoint make the engine's in-memory
// parameters, every operation with its exact inverse for save (hf-numerics.md §8.1, model-families.md §2.2).
//
// Names are patterns: literal text with placeholders {L} (a layer index, bound by matching the parameter's name),
// {E} (an expert index, bound by hf_stack_experts) and, in hf_rename and hf_drop only, a final {*} (any rest).
// A parameter no rule names is stored under its own name, unchanged. Example (Qwen3-MoE, hub layout):
//
//   hf_param("model.layers.{L}.mlp.experts.gate_up_proj",                       // [E, 2I, H]
//            hf_concat(1, {hf_stack_experts(hf_tensor("model.layers.{L}.mlp.experts.{E}.gate_proj.weight")),
//                          hf_stack_experts(hf_tensor("model.layers.{L}.mlp.experts.{E}.up_proj.weight"))}))
//
// Load reads the tree leaves-up (stack experts 0..E−1, then concatenate along dim 1: gate rows, then up rows);
// save walks it root-down and writes the leaves in tree order (gate_0..gate_{E−1}, up_0..up_{E−1}), as
// Transformers' Chunk + SplitModulelist do.
#pragma once
#include <string>
#include <vector>

namespace mt {

// Quantised forms a checkpoint tensor may take instead of a plain float tensor (load only; save writes floats).
enum HfQuant : unsigned {
  hf_plain = 0,
  hf_fp8_block = 1,  // `X` F8_E4M3 + `X_scale_inv` F32 block scales (DeepSeek-V3, §8.6)
  hf_mxfp4 = 2,      // `X_blocks` U8 + `X_scales` U8 instead of `X` (GPT-OSS, §8.5)
};

struct HfNode {
  enum class Kind { tensor, stack_experts, concat, transpose, deinterleave, one_of };
  Kind kind = Kind::tensor;
  std::string name;  // tensor: the checkpoint name pattern (after renames)
  unsigned quant = hf_plain;  // tensor: HfQuant bits accepted on load
  int dim = 0;                // concat, deinterleave: the dimension of this node's tensor
  std::vector<HfNode> parts;  // the operands
};

// One checkpoint tensor [shape of the node].
HfNode hf_tensor(std::string name_pattern, unsigned quant = hf_plain);
// [E, ...] from E tensors [...] whose name binds {E} = 0..E−1 (Transformers' MergeModulelist(dim=0)).
HfNode hf_stack_experts(HfNode per_expert);
// Equal parts joined along `dim` (Concatenate(dim)); save splits it back (Chunk(dim)).
HfNode hf_concat(int dim, std::vector<HfNode> parts);
// The operand with its last two dims swapped ([..., a, b] -> [..., b, a]); its own inverse.
HfNode hf_transpose(HfNode part);
// Along `dim`: the operand's even entries, then its odd ones ([g0 u0 g1 u1 ...] -> [g0 g1 ... | u0 u1 ...]: GPT-OSS
// gate_up columns, gate = [..., ::2], up = [..., 1::2]); save interleaves back.
HfNode hf_deinterleave(int dim, HfNode part);
// The first alternative whose tensors the checkpoint holds (a checkpoint may hold per-expert or fused tensors);
// save writes the first alternative.
HfNode hf_one_of(std::vector<HfNode> alternatives);

struct HfRule {
  enum class Kind { rename, drop, param };
  Kind kind = Kind::param;
  std::string hf;     // rename: checkpoint-side prefix pattern; drop: pattern of checkpoint names ignored on load
  std::string param;  // rename: in-memory-side prefix pattern; param: the parameter's name pattern
  HfNode source;      // param: how checkpoint tensors make it
};

// Checkpoint names starting with `hf_prefix` are known in memory by `param_prefix` + the rest (WeightRenaming,
// e.g. "backbone." <-> "model."). Leaf names of hf_param rules are written on the in-memory side; save renames back.
HfRule hf_rename(std::string hf_prefix, std::string param_prefix);
// Checkpoint tensors ignored on load and never written (MTP layers, a stored copy of a tied head).
HfRule hf_drop(std::string hf_pattern);
// The parameter(s) matching `param_pattern` are made from `source`.
HfRule hf_param(std::string param_pattern, HfNode source);
// A parameter stored under its own name that may also be stored quantised: hf_param(p, hf_tensor(p, quant)).
HfRule hf_quantised(const std::string& param_pattern, unsigned quant);

// The order save_pretrained writes tensors in: the state_dict order of the parameters, or (models Transformers
// converts on load, e.g. qwen3_moe) sorted by in-memory parameter name; each parameter's tensors in tree order.
enum class HfSaveOrder { state_dict, sorted_by_param };

struct HfLayout {
  std::vector<HfRule> rules;
  HfSaveOrder save_order = HfSaveOrder::state_dict;
  // Every checkpoint tensor of 2+ dims may also be stored FP8 block-quantised (hf_fp8_block): fine-grained FP8
  // checkpoints pick which linear layers they quantise (HF's modules_to_not_convert), so the reader takes any
  // tensor that comes with a `_scale_inv`.
  bool fp8_any_matrix = false;
};

// Whether any tensor of the layout may be stored in the quantised form `q` (a config that declares a form the
// family never stores is refused).
bool hf_layout_accepts(const HfLayout& l, HfQuant q);

}  // namespace mt
