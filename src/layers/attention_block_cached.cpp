#include "layers/attention_block_cached.h"

#include "core/error.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

namespace mt {

AttentionCache AttentionCache::create(const AttentionSpec& spec, int64_t capacity) {
  MT_CHECK(spec.kind == AttentionKind::gqa, "attention cache: GQA only");
  return {Tensor::zeros({capacity, spec.kv_heads, spec.head_dim}, DType::F32),
          Tensor::zeros({capacity, spec.kv_heads, spec.value_dim()}, DType::F32)};
}

Tensor attention_block_forward_cached(const BlockEnv& env, const AttentionSpec& spec, const LayerWeights& w,
                                      const Tensor& x, int64_t offset, AttentionCache& cache) {
  const int64_t n = env.tokens(), Hq = spec.heads, Hk = spec.kv_heads, D = spec.head_dim;
  Tensor& k_cache = cache.k;
  Tensor& v_cache = cache.v;
  MT_CHECK(env.batch == 1, "cached attention runs one sequence, batch is {}", env.batch);
  MT_CHECK(k_cache.shape() == Shape({k_cache.dim(0), Hk, D}) && v_cache.shape() == k_cache.shape(),
           "attention cache {} / {} for {} kv heads of {}", k_cache.desc(), v_cache.desc(), Hk, D);
  MT_CHECK(offset >= 0 && offset + n <= k_cache.dim(0), "cache rows [{}, {}) of {}", offset, offset + n,
           k_cache.desc());
  const Tensor none;
  Tensor a = cpu::rmsnorm_forward(x, w.input_norm, env.eps(), env.bf16, env.norm_rounds_once());
  Tensor q = cpu::linear_forward(a, w.q_proj, spec.qkv_bias ? w.q_bias : none, env.bf16);
  Tensor k = cpu::linear_forward(a, w.k_proj, spec.qkv_bias ? w.k_bias : none, env.bf16);
  Tensor v = cpu::linear_forward(a, w.v_proj, spec.qkv_bias ? w.v_bias : none, env.bf16);
  // QK-norm per head over head_dim, before RoPE (Qwen3).
  Tensor qn = spec.qk_norm ? cpu::rmsnorm_forward(q.view({n, Hq, D}), w.q_norm, env.eps(), env.bf16) : q.view({n, Hq, D});
  Tensor kn = spec.qk_norm ? cpu::rmsnorm_forward(k.view({n, Hk, D}), w.k_norm, env.eps(), env.bf16) : k.view({n, Hk, D});
  const bool nope = spec.rope.kind == RopeKind::none;  // Nemotron-H: no positional encoding
  Tensor qr = nope ? qn : cpu::rope_forward(qn, env.rope.of(spec), env.bf16);
  k_cache.rows(offset, offset + n).copy_from(nope ? kn : cpu::rope_forward(kn, env.rope.of(spec), env.bf16));
  v_cache.rows(offset, offset + n).copy_from(v.view({n, Hk, D}));
  cpu::AttentionDecodeShape shape{offset, n, Hq, Hk, D};
  shape.window = spec.sliding_window;
  shape.scale = static_cast<float>(spec.scale);
  shape.eager_bf16 = spec.eager_bf16;
  Tensor o = cpu::attention_decode_forward(shape, qr, k_cache, v_cache, env.bf16, spec.sinks ? w.sinks : none);
  Tensor out = cpu::linear_forward(o.view({n, Hq * D}), w.o_proj, spec.o_bias ? w.o_bias : none, env.bf16);
  return cpu::residual_add(x, out, env.bf16);
}

}  // namespace mt
