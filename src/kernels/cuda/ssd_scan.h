// Mamba2's selective state-space scan (SSD) on CUDA, chunked, fp32 state and fp32 math. The contract is the CPU's
// (kernels/cpu/ssd_scan.h): per head h of `heads`, group g = h / (heads / groups), state S_h [P, N] zero at every
// document start (a batch row always starts one):
//   S_t = exp(dt_t·A_h) · S_{t−1} + dt_t · x_t ⊗ B_t          y_t = S_t · C_t + D_h · x_t
//
// Chunked form (chunk Q = 64 tokens on a fixed grid over the T tokens; documents cross it freely). Per chunk z and
// head, cs_l = Σ_{i ≤ l in the chunk} A·dt_i (a warp scan in fp32), gate_l = [token l's document began before the
// chunk], ge_l = gate_l·exp(cs_l), w_s = [s is in the document of the chunk's last token]·exp(cs_last − cs_s):
//   y_l    = Σ_{s ≤ l, same document} (C_l·B_s) exp(cs_l − cs_s) dt_s x_s + ge_l · S_in[z] · C_l + D·x_l
//   S_end  = ge_last · S_in[z] + Σ_s w_s · (dt_s x_s) ⊗ B_s,      S_in[z + 1] = S_end[z],  S_in[0] = 0
// Forward kernels: (1) chunk end states from zero, P × N × Q per (chunk, head), into `states`; (2) the sequential
// pass over chunks, in place, turning them into S_in (one thread per state element, 64 steps at T = 4096);
// (3) C·Bᵀ per (chunk, group), Q × Q × N, shared by the group's heads; (4) the outputs per (chunk, head): the
// decay-masked C·Bᵀ times x (Q × Q × P) plus (ge ⊙ C)·S_inᵀ (Q × P × N). Backward: S_in (from `states` or recomputed
// by (1)–(2)); the local ∂/∂S_in = Σ_l ge_l dy_l ⊗ C_l per (chunk, head) and the reverse pass over chunks (dS_in[z] =
// local[z] + ge_last(z)·dS_in[z + 1]); then per (chunk, head) dx, ddt and per-chunk dA/dD partials (products
// M'ᵀ·dy, dy·(dt x)ᵀ, C·S_inᵀ, B·Gᵀ with G = dS_in[z + 1]), and per (chunk, group) dB and dC, the group's heads
// summed in order inside one block (no atomics); dA and dD are summed over chunks in a fixed order. Every result
// is bit-reproducible run to run, and the same with or without the states buffer (the same kernels fill it).
//
// Precision (a choice, see NOTE): every product is fp32 FMA on the CUDA cores (no tensor cores), so the only
// differences from the CPU's sequential recurrence are summation order and exp(cs_l − cs_s) in place of a product
// of per-token exps: ~1e-6 relative per sum, the cs differences ~|cs|·2^-24 absolute (|cs| ≲ 100 inside a chunk at
// real dt·A), so a few 1e-6 relative on y and ~1e-5 on the gradients (whose dcs terms cancel: row minus column sums
// of the masked matrix). NOTE: tf32 mma.sync (10-bit mantissa, ~5e-4 relative per product) or bf16 inputs (2^-9)
// would put ~1e-3 on y; the kernels are structured as tiles of small products so the two big ones (C·S_inᵀ and
// the chunk states, 2·P·N per head and token) can move to mma.sync later without changing the data flow.
//
// Cost at the real shapes (Nemotron 3 Nano: heads 64, P 64, groups 8, N 128; T = 4096, so 64 chunks) per call:
//   forward: MACs per (chunk, head) P·N·Q (states) + Q²·P (diag) + Q·P·N (off) = 1.31 M, + Q²·N per (chunk, group)
//            → 4096 · 1.31 M + 512 · 0.52 M = 5.6 GMAC = 11.3 GFLOP; bytes: act 48 MiB (BF16) read ~3×, y 64 MiB,
//            states 128 MiB written, read+written by the pass, read once: ~0.7 GB.
//   backward: per (chunk, head) 0.52 M (local dS_in) + 1.57 M (dx: M'ᵀdy, dy·xdᵀ, C·S_inᵀ, B·Gᵀ) + 1.31 M (dB/dC:
//            dy·xdᵀ, dy·S_in, xd·G) = 3.4 M, + 1.5 M per (chunk, group) (C·Bᵀ, dCB·B, dCBᵀ·C) → 14.7 GMAC = 29 GFLOP
//            (+ 2.1 GMAC when the states must be recomputed); bytes: dstates 128 MiB written + pass 256 MiB + read
//            twice, S_in read twice, dy 64 MiB read 3×: ~1.4 GB.
//   Prediction (H100, fp32 FMA peak ~60 TFLOP/s; these tiles reach ~40–50% of it, shared-memory bound at 12 loads
//   per 32 FMAs): forward ~0.4–0.5 ms, backward ~1.1–1.4 ms (+0.2 ms without states), memory ~0.2 + 0.4 ms
//   overlapping only partly. To be measured (mixtune_bench_ssd_scan). Scales linearly in T.
// Memory: states = ceil(T / 64) · heads · P · N fp32 = 128 MiB at T = 4096 (32 MiB per 1024 tokens); the backward
// takes another buffer of that size (dS_in) plus C·Bᵀ (ceil(T / 64) · groups · 64² fp32 = 8 MiB at T = 4096), and
// the forward, without a states buffer, a temporary one.
//
// Limits: P ≤ 64, N ≤ 128 (the tiles are sized for them; smaller sizes run zero-padded), heads % groups == 0.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/flash_attention.h"  // AttentionDocs

namespace mt::cuda {

struct SsdScanShape {
  int64_t heads = 0, head_dim = 0, groups = 0, state = 0;  // P = head_dim, N = state
};

// Chunk length of the CUDA scan (tokens).
constexpr int64_t kSsdChunk = 64;

// Elements (F32) of the forward's states buffer for `tokens` tokens: ceil(tokens / 64) · heads · P · N.
int64_t ssd_scan_states_numel(const SsdScanShape& s, int64_t tokens);

// act [T, W] (BF16|F32) holds x | B | C as columns: x = [0, heads·P) viewed [heads, P], B = [heads·P, heads·P +
// groups·N), C = the next groups·N columns (W >= heads·P + 2·groups·N). dt F32 [T, heads] (after softplus/clamp),
// A F32 [heads] (negative), D [heads] (BF16|F32). docs: only docs.start is read (a document is contiguous).
// -> y F32 [T, heads·P] (overwritten). states: F32 with ssd_scan_states_numel elements, filled with S_in of every
// (chunk, head) for the backward, or null (a temporary is used).
void ssd_scan_forward(const SsdScanShape& s, const Tensor& act, const Tensor& dt, const Tensor& A, const Tensor& D,
                      const AttentionDocs& docs, Tensor& y, Tensor* states, cudaStream_t stream);

// dy F32 [T, heads·P] -> dact [T, W] (act's dtype; the x | B | C columns overwritten, other columns untouched; fp32
// math rounded once), ddt F32 [T, heads] (overwritten), dA F32 [heads] (overwritten), dD F32 [heads] (+=; undefined:
// D frozen). states: what the forward filled, or null (recomputed). Deterministic (fixed-order sums, no atomics).
void ssd_scan_backward(const SsdScanShape& s, const Tensor& act, const Tensor& dt, const Tensor& A, const Tensor& D,
                       const AttentionDocs& docs, const Tensor& dy, const Tensor* states, Tensor& dact, Tensor& ddt,
                       Tensor& dA, Tensor& dD, cudaStream_t stream);

}  // namespace mt::cuda
