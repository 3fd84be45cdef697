// The common description of a decoder-only causal LM: the model-level parts (embedding, final norm, head,
// tying, numerics rules) and, per layer, its sublayers (attention, dense MLP, MoE, Mamba2), each wrapped as
// pre-norm + residual. A family file (src/models/families/) turns its config.json into one of these; the
// parameter table, the engines' generic models, the memory plan and the CLI read only this, so nothing
// outside a family file tests a family's name.
//
// Sublayer kinds and their options are declared here for every family in view (Qwen3 / Qwen3-MoE, GPT-OSS,
// DeepSeek-V3, Nemotron-H); model_config_check (models/decoder_model.h) refuses what the engines do not run
// yet, with a one-line error.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mt {

enum class RopeKind {
  none,      // no positional rotation (NoPE; Nemotron-H's attention)
  standard,  // inv_freq_i = theta^(-2i/D)
  yarn,      // YaRN frequency interpolation (GPT-OSS, DeepSeek-V3)
};

struct RopeSpec {
  RopeKind kind = RopeKind::standard;
  double theta = 10000.0;
  int64_t rotary_dim = 0;  // dims rotated per head; 0 = the whole head
  bool interleaved = false;  // pairs (2i, 2i+1) instead of the two halves (DeepSeek-V3)
  // YaRN (kind == yarn)
  double factor = 1.0, beta_fast = 32.0, beta_slow = 1.0;
  double attention_factor = 1.0;  // cos and sin scaled by it
  int64_t original_max_position = 0;
  bool truncate = true;

  bool operator==(const RopeSpec&) const = default;  // the same rotation: layers may share one table
};

// Transformers' YaRN get_mscale (modeling_rope_utils.py; DeepSeek-V3's yarn_get_mscale): 0.1·m·ln(factor) + 1, or 1
// when factor <= 1. The families' attention factors and DeepSeek-V3's softmax scale are ratios and squares of it.
double yarn_mscale(double factor, double m);

enum class AttentionKind {
  gqa,  // grouped-query attention (MHA and MQA are its special cases)
  mla,  // multi-head latent attention (DeepSeek-V3): layers/mla_attention_block.h
};

struct AttentionSpec {
  AttentionKind kind = AttentionKind::gqa;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;    // of queries and keys
  int64_t v_head_dim = 0;  // of values; 0 = head_dim
  bool qk_norm = false;    // RMSNorm per head over head_dim on q and k, before RoPE (Qwen3)
  bool qkv_bias = false, o_bias = false;
  bool sinks = false;          // a learned per-head extra softmax column (GPT-OSS)
  int64_t sliding_window = 0;  // 0 = full causal attention
  double scale = 0;            // softmax scale; 0 = head_dim^-1/2
  // Transformers runs this attention eagerly (GPT-OSS: sdpa is not allowed), so in bf16 the scores and the softmax
  // round as eager ops do (kernels/cpu/attention.h); otherwise as sdpa.
  bool eager_bf16 = false;
  RopeSpec rope;
  // MLA (kind == mla)
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0;

  int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};

enum class Activation {
  swiglu,      // silu(gate) * up
  swiglu_oai,  // GPT-OSS: clamped, gate * sigmoid(1.702 gate) * (up + 1)
  relu2,       // relu(up)^2, no gate (Nemotron-H)
};

struct MlpSpec {
  int64_t intermediate_size = 0;
  Activation activation = Activation::swiglu;
  bool bias = false;
};

enum class RouterScore {
  softmax_topk,   // softmax over all experts (fp32), top-k, optional renormalisation (Qwen3-MoE)
  topk_softmax,   // top-k of the logits, softmax over those k (GPT-OSS)
  sigmoid_group,  // sigmoid, group-limited top-k with a correction bias (DeepSeek-V3, Nemotron-H)
};

struct RouterSpec {
  RouterScore score = RouterScore::softmax_topk;
  bool norm_topk_prob = false;   // renormalise the k selected weights to sum 1
  bool linear_bias = false;      // the router linear has a bias
  bool correction_bias = false;  // an fp32 selection bias buffer (e_score_correction_bias)
  double scale = 1.0;            // routed weights multiplied by it
  int64_t groups = 1, topk_groups = 1;
};

struct MoeSpec {
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;  // k
  MlpSpec expert;                 // one expert's MLP (intermediate = moe_intermediate_size)
  RouterSpec router;
  std::optional<MlpSpec> shared_expert;
  // The load-balancing loss over all MoE layers' router logits (Switch Transformer / HF
  // load_balancing_loss_func), added as coef · aux when on.
  bool aux_loss_on = false;
  double aux_loss_coef = 0.0;
};

// Nemotron-H's Mamba2 mixer (hf-numerics.md §6.2; layers/mamba2_mixer_block.h): in_proj -> z | xBC | dt, a causal
// depthwise conv1d over xBC, the SSD scan over `heads` heads of head_dim channels with an N = `state` state shared by
// `groups` groups of heads, a gated RMSNorm over `groups` groups of channels, out_proj.
struct Mamba2Spec {
  int64_t heads = 0, head_dim = 0, state = 0, groups = 0, conv_kernel = 0, chunk = 0;
  bool conv_bias = false;  // conv1d has a bias (use_conv_bias)
  bool proj_bias = false;  // in_proj and out_proj have biases (Nemotron-H's use_bias)
  double norm_eps = 1e-5;  // the gated RMSNorm's
  // dt = max(softplus(dt + dt_bias), time_step_min): Transformers 5.17's chunked (training) path clamps below only.
  double time_step_min = 1e-3;
  // The random init of dt_bias: softplus⁻¹ of dt drawn log-uniformly in [time_step_min, time_step_max], at least
  // time_step_floor (NemotronHPreTrainedModel._init_weights).
  double time_step_max = 0.1, time_step_floor = 1e-4;

  int64_t inner() const { return heads * head_dim; }               // d_inner: z, x and y channels
  int64_t conv_dim() const { return inner() + 2 * groups * state; }  // x | B | C, the conv1d's channels
  int64_t in_proj_dim() const { return inner() + conv_dim() + heads; }  // z | xBC | dt
};

enum class SublayerKind { attention, mlp, moe, mamba2 };

// One pre-norm + residual sublayer: x = x + f(norm(x)). `index` selects its spec in the DecoderSpec vector of
// its kind, so layers sharing a configuration share one spec.
struct Sublayer {
  SublayerKind kind = SublayerKind::attention;
  int index = 0;
};

struct LayerSpec {
  std::vector<Sublayer> sublayers;  // in execution order
};

// Where an RMSNorm rounds in bf16 (hf-numerics.md §1.1).
enum class NormRounding {
  qwen,     // bf16(x · rsqrt(mean x² + eps)), then bf16(w · y): two roundings (Qwen3, DeepSeek-V3, Nemotron-H)
  gpt_oss,  // bf16(w · y32): one rounding
};

// How the checkpoint's weights are stored when config.json has a `quantization_config`. Load dequantises them to
// the model dtype (hf-numerics.md §8.6): the model in memory is always float, and to_json() drops the field.
struct CheckpointQuant {
  // fp8_block: fine-grained FP8 (e4m3 + block scales, §8.6); mxfp4: GPT-OSS's experts as MXFP4 blocks + E8M0 scales
  // (§8.5), the rest bf16.
  enum class Method { none, fp8_block, mxfp4 } method = Method::none;
  // fp8_block: quantization_config.weight_block_size [rows, cols] (HF's default [128, 128]).
  int64_t block_rows = 128;
  int64_t block_cols = 128;
};

struct DecoderSpec {
  std::string architecture;  // config.json architectures[0], e.g. "Qwen3MoeForCausalLM"
  std::string model_type;    // config.json model_type

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  double norm_eps = 1e-6;  // every RMSNorm of the model (the block norms, the final norm, QK-norm)
  NormRounding norm_rounding = NormRounding::qwen;
  bool tie_word_embeddings = false;
  // The embedding row of config.json pad_token_id, for families whose Transformers model builds
  // nn.Embedding(V, H, padding_idx = pad_token_id) (Qwen3, Qwen3-MoE, GPT-OSS, DeepSeek-V3; not Nemotron-H): the
  // embedding backward gives that row no gradient and the random init zeroes it. In [0, V) (a negative id wraps
  // as torch does); none when the config has no pad_token_id or the family does not use it.
  std::optional<int64_t> padding_idx;
  double initializer_range = 0.02;  // normal(0, σ) of the random init
  int64_t max_position_embeddings = 0;
  DType dtype = DType::F32;  // the checkpoint's storage dtype (config dtype | torch_dtype)

  // The sublayer configurations the layers refer to (Sublayer::index).
  std::vector<AttentionSpec> attention;
  std::vector<MlpSpec> mlp;
  std::vector<MoeSpec> moe;
  std::vector<Mamba2Spec> mamba2;
  std::vector<LayerSpec> layers;

  CheckpointQuant quant;  // config.json quantization_config (load only)

  nlohmann::json raw;  // config.json as read, carried through to saved checkpoints

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  // The sublayer of `kind` in `layer`, or nullptr when it has none.
  const AttentionSpec* attention_of(int64_t layer) const;
  const MlpSpec* mlp_of(int64_t layer) const;
  const MoeSpec* moe_of(int64_t layer) const;
  const Mamba2Spec* mamba2_of(int64_t layer) const;
  bool is_moe_layer(int64_t layer) const { return moe_of(layer) != nullptr; }
  bool has_moe() const;

  // The engines' model-wide views. Expert parallelism splits every expert stack the same way, so all MoE
  // sublayers share E and k (checked by spec_check); 0 without MoE layers.
  int64_t num_experts() const;
  int64_t experts_per_token() const;
  // The one attention configuration of the model (one RoPE table per batch, one KV-cache shape): throws
  // mt::Error when layers differ. Every engine path today assumes it.
  const AttentionSpec& only_attention() const;
  // Likewise the one MoE configuration (every expert stack alike) and the one dense MLP configuration.
  const MoeSpec& only_moe() const;
  const MlpSpec& only_mlp() const;
  // The load-balancing loss: on when any MoE sublayer has it, with that coefficient.
  bool aux_loss_on() const;
  double aux_loss_coef() const;

  // config.json -> spec through the registry row of architectures[0] (models/registry.h): every error is a
  // one-line mt::Error naming `file` and the field.
  static DecoderSpec from_json(const nlohmann::json& j, const std::string& file);
  static DecoderSpec from_file(const std::string& path);
  // The config.json to save: `raw` with the fields the spec owns written back (v5 spellings), by the family,
  // without `quantization_config` (a saved model is always the dequantised float one).
  nlohmann::json to_json() const;
};

// Structural checks every spec passes (indices in range, the padding index in the vocabulary, MoE sublayers
// agreeing on E and k); throws mt::Error naming `file`.
void spec_check(const DecoderSpec& s, const std::string& file);

const char* sublayer_kind_name(SublayerKind k);

}  // namespace mt
