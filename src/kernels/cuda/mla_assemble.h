// Multi-head latent attention's (DeepSeek-V3) glue between its projections and flash attention on the GPU (the CPU
// twin is the assembly inside layers/mla_attention_block.cpp; hf-numerics.md §5.2). Per token t and head h:
//   query[t, h] = [ q[t, h, :nope] | rope(q[t, h, nope:]) ]
//   key[t, h]   = [ kv[t, h, :nope] | rope(ckv[t, C - rope:]) ]        (one rope key per token, on every head)
//   value[t, h] = [ kv[t, h, nope:] | 0 … ]                            (Dv columns, zero-padded to v_pad)
// q BF16 [T, heads·(nope + rope)] (q_b_proj's or q_proj's output), ckv BF16 [T, C] (kv_a_proj_with_mqa's: the kv
// latent, then the rope key in its last `rope` columns), kv BF16 [T, heads·(nope + Dv)] (kv_b_proj's: k_nope | v per
// head).
// RoPE on the rope columns only, from the batch's table of that width (cos, sin F32 [T, rope/2]): interleaved pairs
// (x_2i, x_2i+1) with the output de-interleaved (evens, then odds: Transformers' apply_rotary_pos_emb_interleave), or
// the half split (x_i, x_{i+rope/2}); bf16: each product and the sum rounded, as the eager ops and the CPU reference.
// The copies are exact.
//
// Backward (the transposes): dq = [ dquery_nope | rope'(dquery_rope) ], dkv = [ dkey_nope | dvalue[:Dv] ] per head,
// and the rope key's gradient, summed over the heads in fp32 (head order) and rotated back in fp32, rounded once, is
// written into the last `rope` columns of dckv (the other columns are the caller's: the latent norm's backward).
// The value padding (v_pad > Dv) lets MLA run on flash kernels of one head size for q, k and v (qk ∈ the head dims
// they have, Dv ≤ qk: zero columns add nothing to the scores, the output's extra columns are zero and their
// gradient is dropped), as Transformers' flash-attention path pads V; v_pad = Dv where the kernels take (qk, Dv).
// Every call is asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

struct MlaAssembleDims {
  int64_t tokens = 0, heads = 0;
  int64_t nope = 0, rope = 0;  // query/key columns without and with RoPE (rope even)
  int64_t v_dim = 0;           // Dv: value columns of kv
  int64_t v_pad = 0;           // value/dvalue head size as flash attention reads it (>= v_dim; 0: v_dim)
  bool interleaved = true;     // RoPE pairs (2i, 2i+1) (DeepSeek-V3's rope_interleave) or the half split
};

// -> query, key BF16 [T, heads, nope + rope], value BF16 [T, heads, v_pad] (allocated by the caller; any shape with
// those element counts).
void mla_assemble_forward(const MlaAssembleDims& d, const Tensor& q, const Tensor& ckv, const Tensor& kv,
                          const Tensor& cos, const Tensor& sin, Tensor& query, Tensor& key, Tensor& value,
                          cudaStream_t stream);

// dquery, dkey BF16 [T, heads, nope + rope], dvalue BF16 [T, heads, v_pad] -> dq BF16 like q, dkv BF16 like kv
// (overwritten) and the last `rope` columns of dckv BF16 [T, C] (C > rope; its other columns untouched).
void mla_assemble_backward(const MlaAssembleDims& d, const Tensor& dquery, const Tensor& dkey, const Tensor& dvalue,
                           const Tensor& cos, const Tensor& sin, Tensor& dq, Tensor& dkv, Tensor& dckv,
                           cudaStream_t stream);

// Columns [src_col, src_col + cols) of src (a 2-D [rows, ·] device tensor) into columns [dst_col, dst_col + cols)
// of dst ([rows, ·], same dtype and device), queued on `stream` (the latent's split from ckv, its gradient's way
// back, the value padding's crop).
void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t cols,
                  cudaStream_t stream);

namespace detail {
void mla_assemble_forward_launch(const void* q, const void* ckv, int64_t ld_ckv, const void* kv, const float* cos,
                                 const float* sin, int64_t T, int64_t heads, int64_t nope, int64_t rope, int64_t dv,
                                 int64_t dv_pad, bool interleaved, void* query, void* key, void* value,
                                 cudaStream_t stream);
void mla_assemble_backward_launch(const void* dquery, const void* dkey, const void* dvalue, const float* cos,
                                  const float* sin, int64_t T, int64_t heads, int64_t nope, int64_t rope, int64_t dv,
                                  int64_t dv_pad, bool interleaved, void* dq, void* dkv, void* dckv, int64_t ld_ckv,
                                  cudaStream_t stream);
}  // namespace detail

}  // namespace mt::cuda
