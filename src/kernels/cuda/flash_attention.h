// Flash attention on the GPU (the CPU twin is kernels/cpu/attention.h): causal grouped-query attention
// over packed documents, bf16 in/out, fp32 softmax. Forward saves the log-sum-exp of each score row;
// backward recomputes the probabilities from it (FlashAttention-2 dataflow, mma.sync).
//
// Tokens are one packed sequence of T = B·S rows (batch rows concatenated): token t attends to keys
// [doc_start[t], t], and with a sliding window W only to keys j > t − W (Transformers' sliding mask, GPT-OSS's
// even layers). Documents are contiguous runs (as packing makes them); a batch row boundary is always a
// document boundary. Head dims 16, 32, 64, 128 and 256 for q, k and v alike, or MLA's (DeepSeek-V3) 192 for q
// and k with 128 for v and the output (FlashAttentionShape::v_dim); heads % kv_heads == 0 (query head h reads
// KV head h / (heads / kv_heads), as repeat_kv does). Every call is asynchronous on `stream`.
//
// Sinks (GPT-OSS, hf-numerics.md §4.2): a learned logit per query head joins each row's softmax as one more
// column with a zero value vector. It is on the scale of the scores (not multiplied by the softmax scale); lse
// includes it, so each row's weights sum to 1 − p_sink with p_sink = exp(sink − lse).
//
// Kernels: head_dim 128 on a cc 9.0 GPU runs the Hopper (TMA + wgmma) forward and backward by default; they
// have no window, sinks or softmax scale other than head_dim^-1/2, so calls with any of those run the mma.sync
// kernels (a window of at least `tokens` is no window, and takes the Hopper path). MLA's 192 / 128 runs the
// Hopper forward by default (MIXTUNE_FLASH_FWD_SM90_MLA=0 opts out) and the mma.sync backward.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

struct AttentionDocs {
  Tensor start;  // I32 [T]: first token of t's document
  Tensor end;    // I32 [T]: one past the last token of t's document
};

// doc I32 [B, S] on a CUDA device (a new document starts where the id changes), or undefined: each
// batch row is one causal sequence.
AttentionDocs attention_docs_from_ids(const Tensor& doc, int64_t batch, int64_t seq, int device, cudaStream_t stream);
// cu_seqlens I32 [docs + 1] on a CUDA device: 0 = cu[0] < ... < cu[docs] = tokens.
AttentionDocs attention_docs_from_cu_seqlens(const Tensor& cu_seqlens, int64_t tokens, cudaStream_t stream);

struct FlashAttentionShape {
  int64_t tokens = 0, heads = 0, kv_heads = 0, head_dim = 0;  // head_dim: of q and k
  int64_t v_dim = 0;    // head size of v, out, dout and dv; 0: head_dim (MLA: 128 against head_dim 192)
  int64_t window = 0;   // > 0: query t sees keys j > t − window only; 0: full causal
  float scale = 0.0f;   // softmax scale on q·k; 0: head_dim^-1/2
};

// q BF16 [T, heads, D] (any shape with that many elements, e.g. [B, S, heads, D]), k BF16 [T, kv_heads, D],
// v BF16 [T, kv_heads, Dv] (D = head_dim, Dv = v_dim or D) -> out BF16 [.., heads, Dv] (q's shape with the last
// dim Dv; allocated as [T, heads, Dv] where q's last dim is not D), lse F32 [heads, T] (natural log; includes the
// sink). Undefined outputs are allocated here; defined ones are checked (element count) and overwritten. sinks:
// F32 [heads] on the device, or undefined (no sink column).
void flash_attention_forward(const FlashAttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionDocs& docs, Tensor& out, Tensor& lse, cudaStream_t stream,
                             const Tensor& sinks = Tensor());

// The Hopper backward's fp32 dQ sums, before the bf16 dq is made from them (layout: flash_dq_layout.cuh);
// a consumer that reads them directly (rmsnorm_rope_backward_from_flash_dq) saves dq's bf16 write and read.
struct FlashDqSums {
  Tensor acc;       // F32 [heads · 2 · tokens · 64]; undefined: the kernel that ran made the bf16 dq instead
  float scale = 0;  // dq = acc × scale
  int64_t tokens = 0, heads = 0;
};

// fast: fp32 atomics add the partial dQ, dK, dV sums (the Hopper kernel where it runs), so the last bits
// vary run to run. deterministic: every sum in a fixed order (the mma.sync kernels with a separate dQ pass:
// S and dP computed twice, and dK/dV workspace for every query head), bitwise the same run to run.
enum class FlashBwdMode { fast, deterministic };

// dout like out ([T, heads, Dv]) -> dq like q, dk like k, dv like v (BF16; allocated here when undefined). fp32
// accumulation in device workspace (see FlashBwdMode for run-to-run reproducibility).
// dq_sums: where the head_dim 128 Hopper kernel runs, it receives the dQ sums and dq is left untouched (not
// allocated); elsewhere (the mma.sync kernels: any window, sinks or non-default scale; MLA's 192 / 128) dq is made as
// usual and dq_sums->acc stays undefined.
// sinks / dsinks: the forward's sinks F32 [heads] (or undefined) and their gradient F32 [heads] on the device,
// ACCUMULATED (dsinks[h] += −Σ_rows p_sink · Σ_d dO·O), summed in a fixed order in both modes (bitwise the same
// run to run). The sinks are only read for dsinks (lse already holds them); dsinks needs sinks.
void flash_attention_backward(const FlashAttentionShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionDocs& docs,
                              Tensor& dq, Tensor& dk, Tensor& dv, cudaStream_t stream, FlashDqSums* dq_sums = nullptr,
                              FlashBwdMode mode = FlashBwdMode::fast, const Tensor& sinks = Tensor(),
                              Tensor* dsinks = nullptr);
// The bf16 dq [tokens, heads, 128] of dQ sums, as flash_attention_backward makes it.
void flash_dq_sums_to_bf16(const FlashDqSums& sums, Tensor& dq, cudaStream_t stream);

}  // namespace mt::cuda
