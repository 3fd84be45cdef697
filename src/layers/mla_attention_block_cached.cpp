#include "layers/mla_attention_block_cached.h"

#include "core/error.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/residual.h"
#include "layers/mla_attention_block.h"

namespace mt {

MlaCache MlaCache::create(const AttentionSpec& spec, int64_t capacity) {
  MT_CHECK(spec.kind == AttentionKind::mla, "MLA cache: multi-head latent attention only");
  return {Tensor::zeros({capacity, spec.kv_lora_rank}, DType::F32),
          Tensor::zeros({capacity, spec.qk_rope_head_dim}, DType::F32)};
}

int64_t MlaCache::bytes() const {
  return latent.defined() ? static_cast<int64_t>(latent.nbytes() + k_rot.nbytes()) : 0;
}

Tensor mla_attention_block_forward_cached(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                          const Tensor& x, int64_t offset, MlaCache& cache) {
  const int64_t n = env.tokens(), Hq = spec.heads, D = spec.head_dim, Dv = spec.value_dim();
  MT_CHECK(env.batch == 1, "cached attention runs one sequence, batch is {}", env.batch);
  MT_CHECK(cache.latent.shape() == Shape({cache.latent.dim(0), spec.kv_lora_rank}) &&
               cache.k_rot.shape() == Shape({cache.latent.dim(0), spec.qk_rope_head_dim}),
           "MLA cache {} / {} for kv_lora_rank {} and qk_rope_head_dim {}", cache.latent.desc(), cache.k_rot.desc(),
           spec.kv_lora_rank, spec.qk_rope_head_dim);
  MT_CHECK(offset >= 0 && offset + n <= cache.latent.dim(0), "cache rows [{}, {}) of {}", offset, offset + n,
           cache.latent.desc());
  MlaBlockActs s;
  const Tensor k_rot = mla_project_rows(env, spec, w, x, s, nullptr);
  cache.latent.rows(offset, offset + n).copy_from(s.kvn);
  cache.k_rot.rows(offset, offset + n).copy_from(k_rot);

  // Every position so far, expanded to per-head keys and values as the training block expands its own.
  const int64_t L = offset + n;
  const Tensor kv = cpu::linear_forward(cache.latent.rows(0, L), w.kv_b_proj, env.bf16);
  Tensor key, value;
  mla_keys_values(spec, kv, cache.k_rot.rows(0, L), key, value);
  cpu::AttentionDecodeShape shape{offset, n, Hq, Hq, D};
  shape.v_dim = Dv;
  shape.scale = static_cast<float>(spec.scale);
  Tensor o = cpu::attention_decode_forward(shape, s.query.view({n, Hq, D}), key, value, env.bf16);
  Tensor out = cpu::linear_forward(o.view({n, Hq * Dv}), w.o_proj, env.bf16);
  return cpu::residual_add(x, out, env.bf16);
}

}  // namespace mt
