#include "models/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/embedding.h"
#include "layers/attention_block_cached.h"
#include "layers/mamba2_mixer_block_cached.h"
#include "layers/mla_attention_block_cached.h"
#include "layers/rope_table_set.h"
#include "layers/lm_head.h"
#include "layers/mlp_block.h"
#include "layers/moe_block.h"
#include "models/decoder_model.h"

namespace mt {

Tensor decoder_layers_forward_cached(const BlockEnv& env, const ModelWeights& w, const Tensor& x, DecodeCache& cache) {
  const DecoderSpec& spec = *env.spec;
  const int64_t n = env.tokens(), offset = cache.length;
  if (offset + n > cache.capacity)
    fail("decode cache: {} positions held and {} more do not fit its capacity of {}", offset, n, cache.capacity);
  // The MoE and MLP blocks work token by token, so the training forward serves the cached path as is.
  Tensor h = x;
  for (int64_t l = 0; l < spec.num_layers(); ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    const std::vector<Sublayer>& subs = spec.layers[static_cast<size_t>(l)].sublayers;
    for (size_t i = 0; i < subs.size(); ++i) {
      const size_t k = static_cast<size_t>(subs[i].index);
      switch (subs[i].kind) {
        case SublayerKind::attention: {
          DecodeCacheEntry* e = cache.find(l, i);
          MT_CHECK(e != nullptr && e->kind == SublayerKind::attention, "layer {} sublayer {}: no attention cache", l,
                   i);
          const AttentionSpec& a = spec.attention[k];
          h = a.kind == AttentionKind::mla ? mla_attention_block_forward_cached(env, a, L, h, offset, e->mla)
                                           : attention_block_forward_cached(env, a, L, h, offset, e->attention);
          break;
        }
        case SublayerKind::moe: h = moe_block_forward(env, spec.moe[k], L, h, nullptr); break;
        case SublayerKind::mlp: h = mlp_block_forward(env, spec.mlp[k], L, h, nullptr); break;
        case SublayerKind::mamba2: {
          DecodeCacheEntry* e = cache.find(l, i);
          MT_CHECK(e != nullptr && e->kind == SublayerKind::mamba2, "layer {} sublayer {}: no Mamba2 cache", l, i);
          h = mamba2_block_forward_cached(env, spec.mamba2[k], L, h, offset, e->mamba2);
          break;
        }
      }
    }
  }
  cache.length = offset + n;
  return h;
}

Generator::Generator(const DecoderSpec& cfg, ModelWeights& weights, int64_t capacity)
    : cfg_(cfg), w_(weights) {
  // The training model's constructor owns the config and parameter checks; reuse them.
  bf16_ = DecoderModel(cfg_, w_).bf16();
  cache_ = DecodeCache::create(cfg_, capacity);
  head_f32_ = cpu::param_f32(cfg_.tie_word_embeddings ? w_.embed : w_.lm_head);  // exact: bf16 ⊂ fp32
}

Tensor Generator::extend(const std::vector<int64_t>& ids, bool all_positions) {
  const int64_t n = static_cast<int64_t>(ids.size()), offset = cache_.length, V = cfg_.vocab_size;
  if (n < 1) fail("generate: no tokens to run");
  Tensor tokens = Tensor::empty({n}, DType::I64), pos = Tensor::empty({n}, DType::I64);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V)
      fail("generate: token id {} at position {} is outside the model vocabulary [0, {})", ids[i], offset + i, V);
    tokens.data_as<int64_t>()[i] = ids[i];
    pos.data_as<int64_t>()[i] = offset + i;
  }
  BlockEnv env;
  env.spec = &cfg_;
  env.batch = 1;
  env.seq = n;
  env.bf16 = bf16_;
  env.rope = RopeTableSet::build(cfg_, pos, bf16_);
  Tensor x = decoder_layers_forward_cached(env, w_, cpu::embedding_forward(tokens, w_.embed), cache_);
  const Tensor last = all_positions ? x : x.rows(n - 1, n);
  LmHeadOutput lm = lm_head_forward(env, w_.final_norm, head_f32_, last, Tensor(), true);
  return all_positions ? lm.logits : lm.logits.view({V});
}

Tensor Generator::prefill(const std::vector<int64_t>& prompt) {
  reset();
  return extend(prompt);
}

GenerateResult generate(const DecoderSpec& cfg, ModelWeights& weights, const std::vector<int64_t>& prompt,
                        const GenerateOptions& o, const std::function<void(int64_t)>& on_token) {
  sampling_options_check(o.sampling);
  const int64_t P = static_cast<int64_t>(prompt.size()), max_pos = cfg.max_position_embeddings;
  if (P == 0) fail("generate: the prompt is empty (it must hold at least one token)");
  if (P > max_pos)
    fail("generate: the prompt has {} tokens, more than max_position_embeddings = {}", P, max_pos);
  if (o.max_new_tokens < 0) fail("--max-new-tokens must be >= 0, found {}", o.max_new_tokens);
  // Every generated token but the last is fed back, and the sequence stops at max_position_embeddings.
  const int64_t budget = std::min(o.max_new_tokens, max_pos - P);
  Generator gen(cfg, weights, P + std::max<int64_t>(budget - 1, 0));
  Rng rng(o.seed, rng_stream_of("generate"));
  GenerateResult r;
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  if (budget == 0) {
    r.stop_reason = o.max_new_tokens == 0 ? "max_new_tokens" : "max_length";
    return r;
  }
  Tensor logits = gen.prefill(prompt);
  auto t1 = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  for (;;) {
    const int64_t id = sample_token(logits.data_as<float>(), logits.numel(), o.sampling, rng);
    r.ids.push_back(id);
    if (on_token) on_token(id);
    if (std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), id) != o.eos_token_ids.end()) {
      r.stop_reason = "eos";
      break;
    }
    if (static_cast<int64_t>(r.ids.size()) == budget) {
      r.stop_reason = budget == o.max_new_tokens ? "max_new_tokens" : "max_length";
      break;
    }
    if (o.stop_requested && o.stop_requested()) {
      r.stop_reason = "stopped";
      break;
    }
    logits = gen.decode_step(id);
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace mt
