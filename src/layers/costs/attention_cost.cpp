#include "layers/costs/attention_cost.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/flash_attention_dims.h"  // header-only: the head sizes, also in CPU builds

namespace mt {

namespace {

// The query's input width: the q LoRA rank, or the hidden size for a plain q_proj.
CostBytes mla_q_in(const AttentionSpec& a, int64_t hidden) { return a.q_lora_rank > 0 ? a.q_lora_rank : hidden; }

// What layers/cuda/mla_attention_block_cuda.h keeps. Kept: the q latent (q LoRA only), q, ckv, kv_b's output kv, the
// attention output o (at the flash value width Dvp) and, where Dvp pads Dv, o without its padding, lse; selective
// recompute drops a, the latent norms' outputs, the latent's copy and the assembled query, key and value.
BlockBytes mla_attention_bytes(const AttentionSpec& a, int64_t hidden, const BlockBatch& b) {
  const CostBytes T = b.tokens, H = hidden, Hq = a.heads, D = a.head_dim, Dv = a.value_dim();
  const CostBytes Dvp = std::max<CostBytes>(mla_flash_value_dim(a), Dv);
  const CostBytes qr = a.q_lora_rank, kvr = a.kv_lora_rank, rope = a.qk_rope_head_dim, nope = a.qk_nope_head_dim;
  const CostBytes th = T * H * kCostBf16;
  const CostBytes qa = T * qr * kCostBf16, q = T * Hq * D * kCostBf16, ckv = T * (kvr + rope) * kCostBf16;
  const CostBytes lat = T * kvr * kCostBf16, kv = T * Hq * (nope + Dv) * kCostBf16;
  const CostBytes vp = T * Hq * Dvp * kCostBf16, o_flat = Dvp > Dv ? T * Hq * Dv * kCostBf16 : 0;
  const CostBytes lse = Hq * T * kCostF32;
  const CostBytes kept = qa + q + ckv + kv + vp /*o*/ + o_flat + lse;
  const CostBytes cheap = th /*a*/ + qa /*q latent normed*/ + 2 * lat /*latent, normed*/ + 2 * q /*query, key*/ +
                          vp /*value*/;
  BlockBytes r;
  r.saved = b.recompute == Recompute::full ? 0 : b.recompute == Recompute::selective ? kept : kept + cheap;
  r.recomputed = b.recompute == Recompute::full ? kept + cheap : b.recompute == Recompute::selective ? cheap : 0;
  // The mma.sync backward's fp32 dQ, dK, dV sums (every head is a key/value head) and delta.
  const CostBytes flash = Hq * (2 * D + Dvp) * T * kCostF32 + Hq * T * kCostF32;
  r.backward = T * Hq * Dv * kCostBf16 /*d(o)*/ + (Dvp > Dv ? vp : 0) /*padded d(o)*/ + flash +
               2 * q + vp /*dquery dkey dvalue*/ + q + kv + ckv /*dq dkv dckv*/ + 2 * lat /*d(kvn) d(latent)*/ +
               2 * qa /*d(qan) d(qa)*/ + th /*da*/;
  return r;
}

double mla_attention_flops_per_token(const AttentionSpec& a, int64_t hidden, int64_t seq) {
  const double H = static_cast<double>(hidden), Hq = static_cast<double>(a.heads), D = static_cast<double>(a.head_dim),
               Dv = static_cast<double>(a.value_dim()), kvr = static_cast<double>(a.kv_lora_rank),
               rope = static_cast<double>(a.qk_rope_head_dim), nope = static_cast<double>(a.qk_nope_head_dim),
               qin = static_cast<double>(mla_q_in(a, hidden));
  const double q = (a.q_lora_rank > 0 ? H * qin : 0.0) + qin * Hq * D;
  const double projections = q + H * (kvr + rope) + kvr * Hq * (nope + Dv) + Hq * Dv * H;
  const double S = static_cast<double>(seq);
  return 2.0 * projections + 2.0 * (S / 2) * Hq * (D + Dv);
}

}  // namespace

int64_t mla_flash_value_dim(const AttentionSpec& a) {
  const int64_t qk = a.head_dim, v = a.value_dim();
  if (cuda::flash_attention_dims_supported(qk, v)) return v;
  if (cuda::flash_attention_head_dim_supported(qk) && v <= qk) return qk;
  return 0;
}

BlockBytes attention_bytes(const AttentionSpec& a, int64_t hidden, const BlockBatch& b) {
  if (a.kind == AttentionKind::mla) return mla_attention_bytes(a, hidden, b);
  MT_CHECK(a.kind == AttentionKind::gqa, "attention cost: only GQA attention has a CUDA block");
  const CostBytes T = b.tokens, H = hidden, Hq = a.heads, Hkv = a.kv_heads, D = a.head_dim, Dv = a.value_dim();
  // Heads of flash's fp32 dK/dV sums: the deterministic backward keeps every query head's, summed in order after.
  const CostBytes flash_kv_heads = b.deterministic ? Hq : Hkv;
  const CostBytes th = T * H * kCostBf16;
  const CostBytes q = T * Hq * D * kCostBf16, k = T * Hkv * D * kCostBf16, v = T * Hkv * Dv * kCostBf16;
  const CostBytes o = T * Hq * Dv * kCostBf16, lse = Hq * T * kCostF32;
  const CostBytes kept = q + k + v + o + lse;
  // qr and kr (after the QK-norm and RoPE) are q and k themselves, no copy, without either (NoPE: Nemotron-H); so are
  // the gradients before them.
  const bool transformed = a.rope.kind != RopeKind::none || a.qk_norm;
  const CostBytes qk = transformed ? q + k : 0;
  const CostBytes cheap = th /*a*/ + qk /*qr, kr*/;
  BlockBytes r;
  r.saved = b.recompute == Recompute::full ? 0 : b.recompute == Recompute::selective ? kept : kept + cheap;
  r.recomputed = b.recompute == Recompute::full ? kept + cheap : b.recompute == Recompute::selective ? cheap : 0;
  const CostBytes flash = (Hq * D + flash_kv_heads * (D + Dv)) * T * kCostF32 + Hq * T * kCostF32;  // dq dk dv, delta
  r.backward = o /*d(o)*/ + flash + q + k + v /*dq dk dv*/ + qk /*after RoPE*/ + qk /*before QK-norm*/ + th /*da*/;
  return r;
}

double attention_flops_per_token(const AttentionSpec& a, int64_t hidden, int64_t seq) {
  if (a.kind == AttentionKind::mla) return mla_attention_flops_per_token(a, hidden, seq);
  MT_CHECK(a.kind == AttentionKind::gqa, "attention cost: only GQA attention has a CUDA block");
  const double H = static_cast<double>(hidden), Hq = static_cast<double>(a.heads),
               Hkv = static_cast<double>(a.kv_heads), D = static_cast<double>(a.head_dim),
               Dv = static_cast<double>(a.value_dim());
  const double projections = H * Hq * D + H * Hkv * D + H * Hkv * Dv + Hq * Dv * H;
  // Keys a query meets, summed over the S queries of a row, per token: causal S²/2 / S = S/2; a window of W keys
  // removes the (S - W)²/2 beyond it.
  const double S = static_cast<double>(seq);
  double pairs = S * S / 2;
  if (a.sliding_window > 0 && a.sliding_window < seq) {
    const double beyond = S - static_cast<double>(a.sliding_window);
    pairs -= beyond * beyond / 2;
  }
  return 2.0 * projections + 2.0 * (pairs / S) * Hq * (D + Dv);
}

CostBytes attention_rope_table_bytes(const AttentionSpec& a, int64_t tokens) {
  if (a.rope.kind == RopeKind::none) return 0;
  const CostBytes rotated = a.rope.rotary_dim > 0 ? a.rope.rotary_dim : a.head_dim;
  return 2 * CostBytes{tokens} * (rotated / 2) * kCostF32;
}

}  // namespace mt
