// Writing config.json back for the family files' to_json: the fields every decoder family spells alike (Transformers
// v5 spellings), on top of the config as read, so keys a family does not own are carried through unchanged.
#pragma once
#include <nlohmann/json.hpp>

#include "models/spec/decoder_spec.h"

namespace mt {

// s.raw with the model-level fields and attention `a`'s sizes written: architectures (when absent), model_type,
// vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, attention_bias,
// tie_word_embeddings, rms_norm_eps, initializer_range, max_position_embeddings; pad_token_id when the spec's
// padding index differs from what the raw config's denotes.
nlohmann::json config_json_common(const DecoderSpec& s, const AttentionSpec& a);

// v5's `rope_parameters` = `rope` (the family's RoPE fields over whatever extra keys it kept), the legacy
// rope_theta / rope_scaling / torch_dtype removed, and `dtype` written.
void config_json_finish(nlohmann::json& j, const DecoderSpec& s, nlohmann::json rope);

// The object the legacy or v5 RoPE fields were read from, to keep their extra keys: `rope_parameters`, or with
// `from_legacy` also `rope_scaling`; an empty object when neither is one.
nlohmann::json config_json_rope_base(const nlohmann::json& j, bool from_legacy);

// `--layers N` on a config: num_hidden_layers = n, and the per-layer lists cut to the first n layers (layer_types;
// dropped when it lists fewer, so the family's default pattern applies) and layer indices past n dropped
// (mlp_only_layers), so the config stays valid for any family. Nemotron-H's layers_block_type / hybrid_override_pattern
// (which define its layer count) are cut to n, or repeated cyclically when they list fewer.
void config_json_set_layers(nlohmann::json& j, int64_t n);

}  // namespace mt
