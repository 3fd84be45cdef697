// Mamba2's causal depthwise conv1d over time + bias + SiLU on the GPU, the twin of kernels/cpu/conv1d_causal.h and
// the silu loops of layers/mamba2_mixer_block.cpp (Transformers' torch path, hf-numerics.md §6.2):
//   conv[t, c] = Σ_{j<K} w[c, j] · x[t − (K−1) + j, c] + b[c]     (x before t's document start = 0)
//   act[t, c]  = silu(conv[t, c])
// x is read straight out of in_proj's output (columns [col0, col0 + C) of proj [T, W]); documents come from
// AttentionDocs (start[t]: the window restarts there, as the CPU's segments). The taps are summed in order j = 0..K−1
// in fp32 without FMA contraction, the bias added last: the same fp32 bits as the CPU loop (expf in silu may differ
// from libm by an ulp).
//
// Layout: a thread owns V consecutive channels (forward: 8 in bf16, 4 in fp32; backward: 4; 1 when C, the column
// offsets, row widths or pointers are not V-aligned) and a run of 16 consecutive tokens, sliding a K-row window of x
// in registers (each x row is loaded once per run, plus K − 1 rows of halo). A block is 32 channel vectors × 8 runs.
// Rows are loaded a step of tokens at a time (forward 4, backward 2: x and dact) before they are used, so each thread
// has several loads in flight; `ptxas -v` (nvcc 13.0, sm_90a) at K = 4: forward 126 (bf16, V = 8) / 77 (fp32)
// registers, backward 118, no spills; launch bounds keep 2 blocks (512 threads) per SM.
// Supports K = 1..4 (Mamba2's d_conv is 4).
//
// Bytes per call (BF16, C = 6144 at T = 16384, i.e. T·C = 100.7 M elements):
//   forward  read x 2·T·C + write act 2·T·C = 403 MB                        -> ~100 µs at ~4 TB/s
//   backward read dact 2·T·C + x 2·T·C, write dx 2·T·C = 604 MB              -> ~150 µs
//            (+ the dw/db partials: ≤ 64 rows × C·(K+1) fp32 = 7.9 MB written and read again, ~4 µs)
// T = 4096: a quarter of that. The halo (K − 1 rows per 16) and the backward's look-ahead (K − 1 more rows of x and
// dact per run) are L1/L2 hits.
// Deterministic dw/db: each thread sums its tokens in order, the 8 runs of a block are added in run order, one
// partial row per block of tokens (≤ 64 of them, fixed by T), then an ordered column sum (mamba2_common.cuh).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/flash_attention.h"

namespace mt::cuda {

// proj [T, W] (BF16|F32): the conv's input is columns [col0, col0 + C) of each row (C = w.dim(0)).
// w [C, 1, K] and b [C] (BF16|F32 parameters; b may be undefined). act [T, C], proj's dtype:
// act = silu(conv) with conv = Σ_j w[c,j]·x[t−(K−1)+j, c] + b[c] in fp32, taps in order, bias last;
// BF16: conv rounded to bf16, then silu rounded (the CPU block's two roundings).
void conv1d_causal_silu_forward(const Tensor& proj, int64_t col0, const Tensor& w, const Tensor& b,
                                const AttentionDocs& docs, Tensor& act, cudaStream_t stream);

// dact [T, C] (act's dtype) -> the conv input's gradient written into columns [dcol0, dcol0 + C) of dproj
// [T, W'] (proj's dtype; other columns untouched), fp32 math, rounded once; silu' at the recomputed
// (bf16-rounded in BF16) conv value; dw F32 [C, 1, K] and db F32 [C] accumulated (+=) in a fixed order
// (deterministic, no float atomics; either may be undefined = frozen / absent; db needs b).
void conv1d_causal_silu_backward(const Tensor& dact, const Tensor& proj, int64_t col0, const Tensor& w,
                                 const Tensor& b, const AttentionDocs& docs, Tensor& dproj, int64_t dcol0,
                                 Tensor& dw, Tensor& db, cudaStream_t stream);

}  // namespace mt::cuda
