#include "models/cuda/cuda_batch.h"

#include <utility>

#include "core/error.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/rope.h"

namespace mt {

namespace {

// Whether a table made for (rope, head_dim) serves attention configuration `a`: every RoPE field alike.
bool rope_table_serves(const RopeSpec& rope, int64_t head_dim, const AttentionSpec& a) {
  const RopeSpec& r = a.rope;
  return head_dim == a.head_dim && rope.kind == r.kind && rope.theta == r.theta && rope.rotary_dim == r.rotary_dim &&
         rope.interleaved == r.interleaved && rope.factor == r.factor && rope.beta_fast == r.beta_fast &&
         rope.beta_slow == r.beta_slow && rope.attention_factor == r.attention_factor &&
         rope.original_max_position == r.original_max_position && rope.truncate == r.truncate;
}

const CudaRopeTable* find_table(const std::vector<CudaRopeTable>& tables, const AttentionSpec& a) {
  for (const CudaRopeTable& t : tables)
    if (rope_table_serves(t.rope, t.head_dim, a)) return &t;
  return nullptr;
}

}  // namespace

const CudaRopeTable& CudaBatch::rope_table(const AttentionSpec& a) const {
  const CudaRopeTable* t = find_table(rope_tables, a);
  if (!t)
    fail("batch: no RoPE table for head_dim {} and rope_theta {} (uploaded for another config)", a.head_dim,
         a.rope.theta);
  return *t;
}

CudaBatch cuda_batch_upload(const DecoderSpec& cfg, const Batch& b, int device, bool document_mask) {
  batch_validate(cfg, b);
  cuda::DeviceContext& ctx = cuda::device_context(device);
  CudaBatch g;
  g.batch = b.input_ids.dim(0);
  g.seq = b.input_ids.dim(1);
  g.uniform_across_ranks = b.uniform_across_ranks;
  const int64_t T = g.tokens();
  g.ids = cuda::to_device(b.input_ids.view({T}), device);
  if (b.labels.defined()) {
    const Tensor targets = cpu::causal_lm_targets(b.labels, cfg.vocab_size);
    const int64_t* y = targets.data_as<int64_t>();
    for (int64_t i = 0; i < targets.numel(); ++i) g.target_count += y[i] != -100;
    g.targets = cuda::to_device(targets.view({T}), device);
    if (g.target_count < T) {
      MT_CHECK(T < (int64_t{1} << 31), "batch: {} tokens in one micro-batch exceed the int32 row index", T);
      Tensor rows = Tensor::empty({g.target_count}, DType::I32), row_targets = Tensor::empty({g.target_count}, DType::I64);
      int64_t n = 0;
      for (int64_t i = 0; i < T; ++i) {
        if (y[i] == -100) continue;
        rows.data_as<int32_t>()[n] = static_cast<int32_t>(i);
        row_targets.data_as<int64_t>()[n++] = y[i];
      }
      g.target_rows = cuda::to_device(rows, device);
      g.row_targets = cuda::to_device(row_targets, device);
    }
  }
  const Tensor positions = cuda::to_device(batch_positions(b).view({T}), device);
  for (const AttentionSpec& a : cfg.attention) {
    // Identical configurations share one table; attention without RoPE (NoPE: Nemotron-H) needs none.
    if (a.rope.kind == RopeKind::none || find_table(g.rope_tables, a)) continue;
    const RopeSpec& r = a.rope;
    if (r.kind != RopeKind::standard && r.kind != RopeKind::yarn)
      fail("config: the CUDA batch has RoPE tables for the default and YaRN RoPE only");
    // GQA rotates whole heads in the half split; MLA (layers/cuda/mla_attention_block_cuda.h) rotates its rope
    // columns, interleaved or split, with frequencies over those columns alone (as layers/rope_table_set.cpp).
    if (a.kind == AttentionKind::gqa && (r.interleaved || r.rotary_dim != 0))
      fail("config: interleaved or partial RoPE on grouped-query attention has no CUDA kernels yet");
    const int64_t D = r.rotary_dim > 0 ? r.rotary_dim : a.head_dim;
    CudaRopeTable t{r, a.head_dim, Tensor::empty({T, D / 2}, DType::F32, Device::cuda(device)),
                    Tensor::empty({T, D / 2}, DType::F32, Device::cuda(device))};
    if (r.kind == RopeKind::yarn)  // the frequencies as the CPU reference computes them (layers/rope_table_set.cpp)
      cuda::rope_tables(positions,
                        cpu::rope_yarn_inv_freq(D, r.theta, r.factor, r.beta_fast, r.beta_slow,
                                                r.original_max_position, r.truncate),
                        static_cast<float>(r.attention_factor), /*bf16=*/true, t.cos, t.sin, ctx.stream);
    else
      cuda::rope_tables(positions, D, r.theta, /*bf16=*/true, t.cos, t.sin, ctx.stream);
    g.rope_tables.push_back(std::move(t));
  }
  const Tensor doc_ids = document_mask ? batch_document_ids(b) : Tensor();
  const Tensor doc_dev = doc_ids.defined() ? cuda::to_device(doc_ids, device) : Tensor();
  g.docs = cuda::attention_docs_from_ids(doc_dev, g.batch, g.seq, device, ctx.stream);
  return g;
}

}  // namespace mt
