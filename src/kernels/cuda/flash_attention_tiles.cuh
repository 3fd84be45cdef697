// Tile sizes of the flash-attention kernels per head_dim, and the shared-memory tile addressing they
// share. Device/host constants only; include from flash_attention_{fwd,bwd}.cu. The byte counts and
// measured register use of each configuration are in NOTES.md (flash attention section).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/mma_sm80.cuh"

namespace mt::cuda::flash {

// The first key query t sees (t < T): its document's start and, with a window W, no key before t − W + 1.
// Both bounds grow with t, so over a run of queries the first query's is the least and the last query's the
// greatest: a query tile's key range starts at its first query's first key, and a key tile is visible to
// every query of a tile when it lies in [first_key(last query), first query].
__device__ __forceinline__ int first_key(const detail::FlashArgs& a, int t) {
  const int ds = a.doc_start[t];
  return a.window > 0 ? max(ds, t - a.window + 1) : ds;
}

// The last query that sees key j (j < T): the last token of j's document and, with a window W, no query past
// j + W − 1 (written so that j + W cannot overflow). Grows with j, like first_key.
__device__ __forceinline__ int last_query(const detail::FlashArgs& a, int j) {
  const int de = a.doc_end[j] - 1;
  return a.window > 0 && de - j >= a.window ? j + a.window - 1 : de;
}

// Byte offset of element (row, col) in a shared tile of CH 16-byte chunks (8 bf16) per row. The chunk
// index is XOR-swizzled so that the 8 rows read by one ldmatrix 8x8 matrix (8 consecutive rows starting
// at a multiple of 8, one logical chunk) land in 8 different 16-byte bank groups of a 128-byte line.
// CH % 8 == 0: mma::swz (chunk ^ row % 8). CH = 4 or 2 (head_dim 32, 16): a row is 64 or 32 bytes, so
// R = 8 / CH consecutive rows share a line, and the row's place in its line already gives R distinct
// bank-group offsets; chunk ^ (row / R) % CH keeps the chunk inside its row (XOR by a value < CH: a
// bijection of the row's chunks) and makes the 8 / R lines of the 8 rows use different chunks, so the 8
// rows hit 8 distinct bank groups. (mma::swz itself needs CH % 8 == 0: with fewer chunks its XOR by
// row % 8 would leave the row.)
//   CH = 4: chunk ^ (row / 2) % 4;  CH = 2: chunk ^ (row / 4) % 2.
template <int CH>
__device__ __forceinline__ uint32_t tile_offset(int row, int col) {
  static_assert(CH == 2 || CH == 4 || CH % 8 == 0, "tile rows of 2, 4 or a multiple of 8 chunks");
  if constexpr (CH % 8 == 0) {
    return mma::swz(row, col, CH);
  } else {
    constexpr unsigned R = 8 / CH;  // rows per 128-byte line
    const unsigned r = static_cast<unsigned>(row), c = static_cast<unsigned>(col);  // unsigned: / and % are shifts
    return (r * CH + ((c >> 3) ^ ((r / R) % CH))) * 16 + (c & 7) * 2;
  }
}

// Rows [row0, row0 + ROWS) of a [T][H][D] tensor at head `head` into a swizzled [ROWS][D] shared tile with
// cp.async, THREADS threads each taking 16-byte chunks; rows >= T are zero-filled.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_rows(uint32_t s, const mma::bf16* base, int row0, int T, int H, int head) {
  constexpr int CH = D / 8;
#pragma unroll
  for (int it = 0; it < (ROWS * CH + THREADS - 1) / THREADS; ++it) {
    const int idx = it * THREADS + threadIdx.x;
    if (ROWS * CH % THREADS != 0 && idx >= ROWS * CH) break;
    const int i = idx / CH, c = idx % CH, t = row0 + i;
    const bool valid = t < T;
    const mma::bf16* src = valid ? base + (static_cast<int64_t>(t) * H + head) * D + c * 8 : base;
    mma::cp_async_16(s + tile_offset<CH>(i, c * 8), src, valid);
  }
}

// Forward: a block of WARPS x 16 query rows (BM) walks the key range in tiles of BN keys; Q stays in
// shared memory, K and V tiles are double-buffered. Per warp the O accumulator is 16 x DV fp32 (DV / 2
// registers per thread) and the score tile 16 x BN (BN / 2 registers per thread). DQK: head size of q and k,
// DV: of v and the output (equal except MLA's 192 / 128).
template <int DQK, int DV = DQK>
struct FwdCfg;
// head_dim 16: Q·Kᵀ is one mma k-step and the O accumulator 8 registers. Three blocks per SM (registers
// capped at 80: 80 used, no spills; 90 at the 128 cap); 128-key tiles spill at 80 (120 registers at 128).
template <>
struct FwdCfg<16> {
  static constexpr int BM = 128, BN = 64, WARPS = 8, MIN_BLOCKS = 3;
};
// Small O accumulator (16 registers): two blocks per SM (registers capped at 128; 115 used, no spills;
// 128-key tiles would spill at that cap).
template <>
struct FwdCfg<32> {
  static constexpr int BM = 128, BN = 64, WARPS = 8, MIN_BLOCKS = 2;
};
template <>
struct FwdCfg<64> {
  static constexpr int BM = 128, BN = 64, WARPS = 8, MIN_BLOCKS = 1;
};
template <>
struct FwdCfg<128> {
  static constexpr int BM = 128, BN = 64, WARPS = 8, MIN_BLOCKS = 1;
};
// 128 O registers per thread: key tiles of 32 keep the scores at 16 registers (252 registers, no
// spills; 64-key tiles spill 132 bytes at the 255 cap), and shared memory at 128 KiB (64 KiB Q +
// 2 x 2 x 16 KiB K/V), which also fits an sm_80 part.
template <>
struct FwdCfg<256> {
  static constexpr int BM = 128, BN = 32, WARPS = 8, MIN_BLOCKS = 1;
};
// MLA (DeepSeek-V3): q·k over 192 columns, 128 value columns. The live registers are D = 128's (O 64, scores
// 32 at 64-key tiles; Q·Kᵀ only takes 12 k-steps instead of 8); shared memory 128 KiB (Q 48 + 2 x (K 24 +
// V 16) KiB), which also fits an sm_80 part. Register count and spills: NOTES.md (flash attention, MLA).
template <>
struct FwdCfg<192, 128> {
  static constexpr int BM = 128, BN = 64, WARPS = 8, MIN_BLOCKS = 1;
};

template <int DQK, int DV = DQK>
constexpr int fwd_smem_bytes() {
  using C = FwdCfg<DQK, DV>;
  static_assert(C::BM == 16 * C::WARPS && C::BN % 16 == 0, "forward tile shape");
  static_assert(DV <= DQK, "the output is staged in the warp's own Q rows");
  return (C::BM * DQK + 2 * C::BN * DQK + 2 * C::BN * DV) * 2;  // Q + double-buffered K and V
}

// Backward: a block of 8 warps x 16 keys (BN = 128) walks the queries that see its keys in steps of BMQ
// (Q, dO, lse, delta, doc_start double-buffered). Per warp dK and dV accumulate 16 x DHK and 16 x DHV fp32 in
// registers (DHK / 2 + DHV / 2 registers per thread), so a row of dK plus dV is capped near 256 columns: for
// D = 256 each block owns one column slice of dQ/dK/dV (grid z = SLICES: DHK = DQK / SLICES, DHV = DV / SLICES)
// and recomputes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ over the full head sizes (2 of the 5 GEMMs done twice: 1.4x the
// FLOPs, traded for no dK/dV exchange between warps).
template <int DQK, int DV = DQK>
struct BwdCfg;
// head_dim 16: the dQ warp split needs DQN = DHK / WD / 8 even, so WD = 1 and all 8 warps split the
// queries: BMQ = 128. The 16 x 128 Sᵀ and dPᵀ tiles are 128 registers per thread: 216 used, one block
// per SM (two blocks would cap at 128 and spill ~1 KB).
template <>
struct BwdCfg<16> {
  static constexpr int BMQ = 128, SLICES = 1, MIN_BLOCKS = 1;
};
// BMQ = 64 is the smallest step the dQ warp split allows at DHK = 32 (DQN = 2). Two blocks per SM cap
// registers at 128: ptxas spills 20 bytes there (12 before the sliding window; 198 registers uncapped, one
// block per SM).
template <>
struct BwdCfg<32> {
  static constexpr int BMQ = 64, SLICES = 1, MIN_BLOCKS = 2;
};
template <>
struct BwdCfg<64> {
  static constexpr int BMQ = 64, SLICES = 1, MIN_BLOCKS = 1;
};
template <>
struct BwdCfg<128> {
  static constexpr int BMQ = 32, SLICES = 1, MIN_BLOCKS = 1;
};
template <>
struct BwdCfg<256> {
  static constexpr int BMQ = 32, SLICES = 2, MIN_BLOCKS = 1;
};
// MLA (DeepSeek-V3): dK 192 + dV 128 columns, 192 + Sᵀ 16 + dPᵀ 16 accumulator registers per thread at
// BMQ = 32: ptxas (sm_90a) holds it in 255 registers with 16 bytes of spills. Also built with two slices
// (dK 96 + dV 64 columns each; Sᵀ and dPᵀ twice: 1.38x the MMAs; 242 registers, no spills), chosen at run time
// (detail::flash_bwd_mla_slices_set) until the two are measured. Numbers: NOTES.md (flash attention, MLA).
template <>
struct BwdCfg<192, 128> {
  static constexpr int BMQ = 32, SLICES = 1, MIN_BLOCKS = 1;
};

constexpr int kBwdBN = 128, kBwdWarps = 8, kBwdThreads = kBwdWarps * 32;

// SLICES_: the column slices (grid z); BwdCfg's unless a variant is asked for (MLA's two-slice one).
template <int DQK, int DV = DQK, int SLICES_ = BwdCfg<DQK, DV>::SLICES>
struct BwdTiles {
  using C = BwdCfg<DQK, DV>;
  static constexpr int BMQ = C::BMQ, SLICES = SLICES_, DHK = DQK / SLICES, DHV = DV / SLICES;
  static constexpr int LDS = BMQ + 8;  // dSᵀ staging row stride (elements): conflict-free ldmatrix
  static constexpr int Q_BYTES = BMQ * DQK * 2, O_BYTES = BMQ * DV * 2;  // one buffer of Q, of dO
  static constexpr int K_BYTES = kBwdBN * DQK * 2, V_BYTES = kBwdBN * DV * 2;
  // K, V, 2 x Q, 2 x dO, dSᵀ, then 2 x (lse, delta, doc_start) of BMQ each.
  static constexpr int SMEM = K_BYTES + V_BYTES + 2 * Q_BYTES + 2 * O_BYTES + kBwdBN * LDS * 2 + 2 * 3 * BMQ * 4;
  // dQ step tile BMQ x DHK split over the warps: WQ warps along queries (16 rows each), WD along columns,
  // DQN 8-column tiles each (an odd DQN takes its last tile with ldmatrix .x2).
  static constexpr int WQ = BMQ / 16, WD = kBwdWarps / WQ, DQN = DHK / WD / 8;
  static_assert(DQK % SLICES == 0 && DV % SLICES == 0 && DHK % 16 == 0 && DHV % 16 == 0 && BMQ % 16 == 0,
                "backward tile shape");
  static_assert(WQ * WD == kBwdWarps && DQN >= 1 && DQN * WD * 8 == DHK, "dQ warp split");
};

// A tile configuration larger than the current device's opt-in shared memory per block (the D = 256
// backward's 203 KiB on an sm_80 part, which allows 163 KiB) fails with the numbers.
inline void require_smem(int bytes, int head_dim, const char* pass) {
  require_smem_fits(static_cast<size_t>(bytes),
                    "flash attention " + std::string(pass) + " at head_dim " + std::to_string(head_dim));
}

}  // namespace mt::cuda::flash
