// One micro-batch on the GPU: validated on the host (ids inside the vocabulary, shapes), then copied
// with the tables every layer shares (RoPE cos/sin of the batch's positions, packed-document ranges).
// Uploading a whole accumulation window before its first forward keeps host syncs out of the step.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/flash_attention.h"
#include "models/spec/decoder_spec.h"
#include "models/decoder_model.h"

namespace mt {

// The RoPE cos/sin of the batch's positions for one (RoPE configuration, head_dim): attention sublayers whose
// configurations agree on both read the same table.
struct CudaRopeTable {
  RopeSpec rope;
  int64_t head_dim = 0;
  Tensor cos, sin;  // F32 [T, D / 2], D the rotated dims (rope.rotary_dim, or head_dim when 0)
};

struct CudaBatch {
  int64_t batch = 0, seq = 0;
  Tensor ids;                // I64 [T] on the device, T = batch · seq
  Tensor targets;            // I64 [T] shifted labels (-100 = ignore), or undefined
  int64_t target_count = 0;  // valid targets (counted on the host)
  // Where some targets are -100: the rows that have one (I32 [target_count]) and their targets (I64), so the
  // LM head computes logits for those rows only (ignored rows add nothing to the loss or any gradient).
  // Undefined when every row has a target.
  Tensor target_rows, row_targets;
  // One table per distinct (rope, head_dim) among the spec's attention configurations that rotate (none for a
  // spec whose attention has no RoPE, Nemotron-H's); an attention block finds its own with rope_table().
  std::vector<CudaRopeTable> rope_tables;
  cuda::AttentionDocs docs;  // per token: its document's [start, end)
  bool uniform_across_ranks = true;  // Batch::uniform_across_ranks
  int64_t tokens() const { return batch * seq; }
  // The table of an attention configuration (mt::Error when the batch was uploaded for a spec without it).
  const CudaRopeTable& rope_table(const AttentionSpec& a) const;
};

// document_mask = false: packed documents attend across each other (see ModelOptions).
CudaBatch cuda_batch_upload(const DecoderSpec& cfg, const Batch& b, int device, bool document_mask = true);

}  // namespace mt
