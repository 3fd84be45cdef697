// The sm90 flash backward's fp32 dQ sums (flash_attention_bwd_sm90.cu): [Hq][2 column halves][T][64], and inside
// a token's half the column pair 4j + e (columns 8j + 2e, +1; j < 8, e < 4) at pair slot 4(j ^ (t & 3)) + e, so a
// warpgroup's 64 x 64 dQ tile is one contiguous run (one bulk reduce-add). Shared by the kernel that turns them
// into bf16 dq and the fused QK-norm + RoPE backward that reads them directly (rmsnorm.cu). The 192 / 128 (MLA)
// sm90 backward keeps [Hq][3 column thirds][T][64] with the same in-row permutation (flash_dq_slot; its own
// conversion in flash_attention_bwd_sm90_mla.cu).
#pragma once
#include <cstdint>

namespace mt::cuda {

// Pair index <-> storage slot inside a token's half-row of 32 pairs (the map is its own inverse).
__host__ __device__ inline int flash_dq_slot(int64_t t, int pair) { return pair ^ (static_cast<int>(t & 3) << 2); }
// First float of half-row c (0: columns 0..63, 1: 64..127) of query head h at token t.
__host__ __device__ inline int64_t flash_dq_row_offset(int64_t T, int64_t t, int64_t h, int c) {
  return ((2 * h + c) * T + t) * 64;
}

}  // namespace mt::cuda
