// Text generation with the generic decoder on the CPU reference backend: a per-sublayer cache (decode_cache.h),
// the prompt run once (prefill), then one token per step against the cache. The logits equal those of
// DecoderModel::forward() over the whole sequence (same ops and bf16 rounding points; fp32 sums may
// associate differently inside the GEMMs), except after a Mamba2 prefill: its steps run the recurrence instead of the
// chunked scan (equal up to fp32 rounding in fp32; in bf16 Transformers' decode rounding, a few ulps away:
// layers/mamba2_mixer_block_cached.h). One sequence at a time.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/block_env.h"
#include "models/decode_cache.h"
#include "models/spec/decoder_spec.h"
#include "models/model_weights.h"
#include "models/sampling.h"

namespace mt {

// The decoder layers over n new rows x F32 [n, hidden] at positions cache.length..cache.length+n-1 (env: batch 1,
// seq n, the RoPE tables of those positions): each sublayer of the spec runs its block, the stateful ones against
// their cache entry, which they extend; cache.length advances by n. mt::Error (one line) when the n positions do
// not fit the capacity. Generator::extend puts the embedding before it and the LM head after.
Tensor decoder_layers_forward_cached(const BlockEnv& env, const ModelWeights& w, const Tensor& x, DecodeCache& cache);

class Generator {
 public:
  // Checks cfg and the weights as DecoderModel does (F32 or BF16 on the CPU; mt::Error otherwise) and
  // allocates a cache for `capacity` positions.
  Generator(const DecoderSpec& cfg, ModelWeights& weights, int64_t capacity);

  // Runs `ids` at positions length()..length()+n-1 and appends their state (keys/values, or MLA's latent and rope
  // key) to the cache, or advances it (Mamba2's conv window and SSM state).
  // Returns F32 logits [n, V] when all_positions, else [V] for the last token. mt::Error for an empty
  // list, an id outside the vocabulary, or more positions than the capacity.
  Tensor extend(const std::vector<int64_t>& ids, bool all_positions = false);
  // Empties the cache and runs the prompt: the logits [V] that predict the token after it.
  Tensor prefill(const std::vector<int64_t>& prompt);
  // One token at position length(): the logits [V] that predict the next one.
  Tensor decode_step(int64_t id) { return extend({id}); }

  void reset() { cache_.length = 0; }
  int64_t length() const { return cache_.length; }
  int64_t capacity() const { return cache_.capacity; }
  const DecodeCache& cache() const { return cache_; }
  const DecoderSpec& config() const { return cfg_; }

 private:
  DecoderSpec cfg_;
  ModelWeights& w_;
  bool bf16_ = false;
  DecodeCache cache_;
  Tensor head_f32_;  // the LM head as fp32, converted once (lm_head_forward would convert a BF16 head per call)
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  uint64_t seed = 0;
  std::vector<int64_t> eos_token_ids;  // generation stops after producing any of these
  std::function<bool()> stop_requested;  // polled after each token: true ends generation ("stopped")
};

struct GenerateResult {
  std::vector<int64_t> ids;  // the generated tokens, the EOS that stopped generation included
  // "eos" | "max_new_tokens" | "max_length" (prompt + generated reached max_position_embeddings) | "stopped"
  std::string stop_reason;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Prefill + sampled (or greedy) decode. A prompt longer than max_position_embeddings, an empty prompt,
// max_new_tokens < 0 or bad sampling options are an mt::Error. on_token (optional) sees each
// generated id as soon as it is chosen (streaming). The draws use Rng(seed, rng_stream_of("generate")).
GenerateResult generate(const DecoderSpec& cfg, ModelWeights& weights, const std::vector<int64_t>& prompt,
                        const GenerateOptions& options, const std::function<void(int64_t)>& on_token = {});

}  // namespace mt
