// The parameters of a decoder model in the engines' layout: one tensor per entry of the model's parameter
// table (models/param_table.h, made by its family file from the DecoderSpec), held in the slots the blocks
// read. Experts are stacked per layer as Transformers v5 holds them in memory (hf-numerics.md §3.3):
//   experts_gate_up [E, 2I, H]  rows 0..I-1 = gate_proj, rows I..2I-1 = up_proj
//   experts_down    [E, H, I]
// Every linear weight is [out, in] as in nn.Linear. The same struct holds gradients.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/param_table.h"
#include "models/spec/decoder_spec.h"

namespace mt {

// ParamEntry::slot of a table entry: the ModelWeights member holding it (model-level slots for layer -1, the
// LayerWeights members otherwise). The norm before a layer's attention sublayer is input_norm, the one before its
// feed-forward sublayer (MLP or MoE) post_norm; a Mamba2 mixer's is input_norm. Nemotron-H's one norm per layer
// (model.layers.L.norm.weight) takes the slot its sublayer's kind reads.
struct WeightSlot {
  enum : int {
    embed, final_norm, lm_head,  // model level
    input_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm,  // attention sublayer
    post_norm, router, experts_gate_up, experts_down,  // MoE sublayer (post_norm: any feed-forward sublayer)
    mlp_gate, mlp_up, mlp_down,  // dense MLP sublayer
    q_bias, k_bias, v_bias, o_bias, sinks,  // attention biases and sink logits (GPT-OSS)
    router_bias, experts_gate_up_bias, experts_down_bias,  // router and expert biases (GPT-OSS)
    // Multi-head latent attention (DeepSeek-V3): the query's low-rank pair (or q_proj without it), the joint
    // key/value latent with its norm and up-projection
    q_a_proj, q_a_norm, q_b_proj, kv_a_proj, kv_a_norm, kv_b_proj,
    router_score_bias,                     // the fp32 selection bias of a sigmoid router (a buffer, not trained)
    shared_gate, shared_up, shared_down,   // the shared expert beside the routed ones
    // Mamba2 mixer (Nemotron-H): projections, the causal conv1d, the scan's per-head parameters, the gated norm
    mamba_in_proj, mamba_in_proj_bias, mamba_conv_weight, mamba_conv_bias, mamba_dt_bias, mamba_a_log, mamba_d,
    mamba_norm, mamba_out_proj, mamba_out_proj_bias,
    last_layer_slot = mamba_out_proj_bias,
  };
};

struct LayerWeights {
  Tensor input_norm;  // [H]           model.layers.L.input_layernorm.weight
  Tensor q_proj;      // [heads*D, H]  model.layers.L.self_attn.q_proj.weight
  Tensor k_proj;      // [kv*D, H]
  Tensor v_proj;      // [kv*D, H]
  Tensor o_proj;      // [H, heads*D]
  Tensor q_norm;      // [D]
  Tensor k_norm;      // [D]
  Tensor post_norm;   // [H]           model.layers.L.post_attention_layernorm.weight
  // MoE layers
  Tensor router;           // [E, H]     model.layers.L.mlp.gate.weight
  Tensor experts_gate_up;  // [E, 2I, H] (HF: experts.e.gate_proj / up_proj, stacked); [E, I, H] up_proj alone for
                           //            experts without a gate (ReLU², Nemotron-H's mixer.experts.up_proj)
  Tensor experts_down;     // [E, H, I]  (HF: experts.e.down_proj, stacked)
  // Dense MLP layers (mlp_gate absent for an activation without a gate: ReLU²)
  Tensor mlp_gate;  // [F, H]
  Tensor mlp_up;    // [F, H]
  Tensor mlp_down;  // [H, F]
  // Attention biases and per-head sink logits (attention_bias, sinks)
  Tensor q_bias;  // [heads*D]
  Tensor k_bias;  // [kv*D]
  Tensor v_bias;  // [kv*D]
  Tensor o_bias;  // [H]
  Tensor sinks;   // [heads]   model.layers.L.self_attn.sinks
  // Router and expert biases (RouterSpec::linear_bias, MlpSpec::bias of the experts)
  Tensor router_bias;           // [E]
  Tensor experts_gate_up_bias;  // [E, 2I] gate entries, then up entries (as experts_gate_up's rows)
  Tensor experts_down_bias;     // [E, H]
  // MLA (AttentionKind::mla): q_proj is the full query projection when there is no q LoRA (q_lora_rank 0)
  Tensor q_a_proj;   // [q_lora, H]                     self_attn.q_a_proj.weight
  Tensor q_a_norm;   // [q_lora]                        self_attn.q_a_layernorm.weight
  Tensor q_b_proj;   // [heads*(nope+rope), q_lora]     self_attn.q_b_proj.weight
  Tensor kv_a_proj;  // [kv_lora+rope, H]               self_attn.kv_a_proj_with_mqa.weight
  Tensor kv_a_norm;  // [kv_lora]                       self_attn.kv_a_layernorm.weight
  Tensor kv_b_proj;  // [heads*(nope+v), kv_lora]       self_attn.kv_b_proj.weight
  // Sigmoid routers' selection bias (RouterSpec::correction_bias): F32 whatever the model dtype
  Tensor router_score_bias;  // [E]  mlp.gate.e_score_correction_bias
  // The shared expert (MoeSpec::shared_expert): an MLP of intermediate size Fs (no gate for ReLU²)
  Tensor shared_gate;  // [Fs, H]  mlp.shared_experts.gate_proj.weight
  Tensor shared_up;    // [Fs, H]
  Tensor shared_down;  // [H, Fs]
  // Mamba2 mixer (Mamba2Spec; Nemotron-H's model.layers.L.mixer.*): Di = heads·head_dim, C = Di + 2·groups·state,
  // nh = heads, K = conv_kernel
  Tensor mamba_in_proj;        // [Di + C + nh, H]  in_proj.weight (rows: z, then x|B|C, then dt)
  Tensor mamba_in_proj_bias;   // [Di + C + nh]     in_proj.bias (use_bias)
  Tensor mamba_conv_weight;    // [C, 1, K]         conv1d.weight (depthwise)
  Tensor mamba_conv_bias;      // [C]               conv1d.bias (use_conv_bias)
  Tensor mamba_dt_bias;        // [nh]              dt_bias
  Tensor mamba_a_log;          // [nh]              A_log (A = −exp(A_log))
  Tensor mamba_d;              // [nh]              D (skip)
  Tensor mamba_norm;           // [Di]              norm.weight (gated RMSNorm)
  Tensor mamba_out_proj;       // [H, Di]           out_proj.weight
  Tensor mamba_out_proj_bias;  // [H]               out_proj.bias (use_bias)
};

struct ModelWeights {
  Tensor embed;       // [V, H]  model.embed_tokens.weight
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [H]     model.norm.weight
  Tensor lm_head;     // [V, H]  lm_head.weight; undefined when tie_word_embeddings (embed is used)
  // The spec's parameter table (param_table_of), set by the factories below; null in a default-constructed
  // struct.
  std::shared_ptr<const ParamTable> table;

  const ParamTable& param_table() const;  // throws when `table` is null
  // The member holding a table entry.
  Tensor& slot(const ParamEntry& e);
  const Tensor& slot(const ParamEntry& e) const;

  // Every parameter (the table's entries but buffers) with its in-memory (v5) name, in Transformers'
  // state_dict order (the table's). Empty without a table.
  std::vector<std::pair<std::string, Tensor*>> named_parameters();
  std::vector<std::pair<std::string, const Tensor*>> named_parameters() const;
  // The table's buffers (ParamRole::buffer: held and saved, never trained; DeepSeek-V3's fp32
  // e_score_correction_bias), in table order. An engine that moves the parameters to a device moves these too.
  std::vector<std::pair<std::string, Tensor*>> named_buffers();
  std::vector<std::pair<std::string, const Tensor*>> named_buffers() const;

  // Tensors shaped like the parameters for `cfg`, zero-filled, of `dtype` (gradient buffers, moments).
  // experts_held >= 0: the stacked expert tensors hold that many experts (an expert-parallel rank's slice).
  static ModelWeights zeros_like_config(const DecoderSpec& cfg, DType dtype, int64_t experts_held = -1);
  // Uninitialised tensors shaped like the parameters, on `device` (device buffers for the CUDA path).
  // experts_held >= 0: the stacked expert tensors hold that many experts (an expert-parallel rank's slice).
  static ModelWeights empty_like_config(const DecoderSpec& cfg, DType dtype, Device device,
                                           int64_t experts_held = -1);
  // Every parameter Tensor::absent (shape, dtype and device only, no storage): for planning by names and sizes,
  // or to allocate only some of them (a ZeRO-3 rank's own).
  static ModelWeights absent_like_config(const DecoderSpec& cfg, DType dtype, Device device = Device::cpu(),
                                            int64_t experts_held = -1);
  // Seeded random init by the table's init rule, as Transformers does: normal(0, initializer_range) for
  // linear, embedding, router and expert weights; ones for every RMSNorm weight; the embedding's
  // cfg.padding_idx row zero. One RNG stream per name.
  static ModelWeights random_init(const DecoderSpec& cfg, DType dtype, uint64_t seed);

  // The checkpoint read through the family's rules (registry row hf_layout; models/spec/hf_name_map.h): `lookup`
  // returns the tensor stored under a checkpoint name, `all_names` lists every name stored (so extras are
  // reported). Every tensor is checked (presence, shape, dtype) before anything is allocated; errors are one-line
  // mt::Error naming `source` (a file or directory) and the tensor. Tensors are converted to `dtype`.
  // expert_count >= 0: only experts [expert_first, expert_first + expert_count) of each expert stack are read
  // (an expert-parallel rank's share); the stacks keep all E rows, the others unwritten (their pages are never
  // touched, so they cost no memory until something writes them), or with compact_experts hold just those
  // experts, [expert_count, ...] (the CPU engine trains on them as they are).
  // skip(param) true: that parameter (a table entry's name) is checked but neither allocated nor read; it stays
  // Tensor::absent (a ZeRO-3 rank's parameters owned by other ranks, train/sharded_params.h).
  // file_of(name), when given, is the file holding a tensor, named by errors instead of `source`. FP8 weights
  // (cfg.quant) are dequantised to `dtype`.
  static ModelWeights from_hf(const DecoderSpec& cfg, DType dtype,
                                 const std::function<Tensor(const std::string&)>& lookup,
                                 const std::vector<std::string>& all_names, const std::string& source,
                                 int64_t expert_first = 0, int64_t expert_count = -1,
                                 const std::function<bool(const std::string&)>& skip = {},
                                 bool compact_experts = false,
                                 const std::function<std::string(const std::string&)>& file_of = {});
  // The checkpoint names and tensors the family's rules save (per-expert, original layouts), in the order
  // save_pretrained writes them. A tied lm_head is not a parameter, so it is not written. Tensors are views into
  // this struct where the bytes are contiguous. Stacked expert tensors holding fewer than cfg.num_experts experts
  // (compact_experts) hold experts [expert_first, expert_first + held); the others are still listed, as
  // Tensor::absent (shape only) or, in a fused stack tensor, as unset rows (HfNameMap::save), so a shared save lays
  // out the whole model while this rank writes its experts.
  std::vector<std::pair<std::string, Tensor>> to_hf(const DecoderSpec& cfg, int64_t expert_first = 0) const;

  int64_t parameter_count() const;
};

}  // namespace mt
