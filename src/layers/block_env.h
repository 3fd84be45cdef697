// What every decoder block of a step shares: batch geometry, the model spec (model-level parts; each block
// also gets its own sublayer spec), the numerics mode, the RoPE tables of this batch's positions (one per
// distinct rotation among the attention sublayers) and the packed-document ids.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "layers/rope_table_set.h"
#include "models/spec/decoder_spec.h"

namespace mt {

struct ExpertParallel;

struct BlockEnv {
  const DecoderSpec* spec = nullptr;
  int64_t batch = 0, seq = 0;  // tokens T = batch · seq, activations are [T, hidden]
  bool bf16 = false;           // parameters are BF16: round where Transformers rounds
  RopeTableSet rope;           // each attention block reads rope.of(its spec): [T, head_dim]
  Tensor doc_ids;              // I32 [batch, seq], or undefined: plain causal attention
  const ExpertParallel* ep = nullptr;  // MoE experts split over ranks (layers/expert_parallel.h), or local

  int64_t tokens() const { return batch * seq; }
  float eps() const { return static_cast<float>(spec->norm_eps); }
  // GPT-OSS's RMSNorm rounds once in bf16 (hf-numerics.md §1.1).
  bool norm_rounds_once() const { return spec->norm_rounding == NormRounding::gpt_oss; }
};

}  // namespace mt
