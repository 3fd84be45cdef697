// Mamba2's gated RMSNorm on the GPU (Zamba2RMSNormGated, norm_before_gate=False), the twin of
// kernels/cpu/rmsnorm_gated.h, with the gate z read straight out of in_proj's output:
//   t = y ⊙ silu(z);  per group of `group` consecutive channels: out = w ⊙ (t · rsqrt(mean(t²) + eps))   (fp32)
// out is rounded once to proj's dtype (the CPU block's bf16(out) before out_proj). Backward as the CPU kernel:
//   u = t·rstd, du = dout ⊙ w, m = mean(du ⊙ u) per group, dt = rstd · (du − u·m), dy = dt ⊙ silu(z),
//   dz = dt ⊙ y ⊙ silu'(z);  dw += Σ_rows dout ⊙ u.
//
// Layout: one block of 256 threads per row (forward) or per run of R consecutive rows (backward); a thread owns the
// elements i = 4·tid + 1024·k (4 consecutive: one 16-byte fp32 / 8-byte bf16 access; 1 element when n, the column
// offsets or pointers are not 4-aligned). t (and dout in the backward) is kept in shared memory; each group's
// sums are taken by one warp from there in a fixed order (warp g, g + 8, …), so a group of any size works.
// The backward re-reads y and z for dy and dz (L1/L2 hits: the row was just read).
//
// Bytes per call (BF16, n = 4096, T = 16384: T·n = 67.1 M elements):
//   forward  read y 4 B + z 2 B, write out 2 B per element = 537 MB              -> ~135 µs at ~4 TB/s
//   backward read dout 2 B + y 4 B + z 2 B, write dy 4 B + dz 2 B = 940 MB      -> ~235 µs
//            (+ the dw partials: ≤ 512 rows × n fp32 = 8.4 MB written and read again, ~4 µs)
// Deterministic dw: each block sums its rows in row order per element (a thread owns its elements), one partial
// row per block (≤ 512 blocks, fixed by T), then an ordered column sum (mamba2_common.cuh).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

// y F32 [T, n]; z = columns [zcol0, zcol0 + n) of proj [T, W] (BF16|F32); w [n] (BF16|F32); per group of
// `group` channels: out = w ⊙ t·rsqrt(mean(t²)+eps), t = y ⊙ silu(z), fp32; out [T, n] in proj's dtype,
// rounded once.
void rmsnorm_gated_forward(const Tensor& y, const Tensor& proj, int64_t zcol0, const Tensor& w, int64_t group,
                           float eps, Tensor& out, cudaStream_t stream);
// dout [T, n] (out's dtype) -> dy F32 [T, n] (overwritten), dz written into columns [dzcol0, +n) of dproj
// (proj's dtype; other columns untouched); dw F32 [n] += Σ_rows (fixed order; undefined = frozen).
void rmsnorm_gated_backward(const Tensor& dout, const Tensor& y, const Tensor& proj, int64_t zcol0, const Tensor& w,
                            int64_t group, float eps, Tensor& dy, Tensor& dproj, int64_t dzcol0, Tensor& dw,
                            cudaStream_t stream);

}  // namespace mt::cuda
