// The device-side tile schedule both M-grouped expert GEMM kernels share (grouped_gemm.cu's mma.sync one,
// grouped_gemm_sm90.cu's wgmma one): each block copies the expert offsets into shared memory and
// builds the exclusive prefix of m-tiles per expert with a block scan, then maps a linear tile index to
// (expert, first row, expert's end row, first column) by binary search. No host sync; empty experts own
// no tile.
#pragma once
#include <cstdint>

namespace mt::cuda {

// s_off[0..E] = offsets, s_tiles[e] = m-tiles (of BM rows) of the experts before e, s_tiles[E] = all.
// Every thread of the block (THREADS of them) takes part; ends with __syncthreads.
template <int THREADS, int BM>
__device__ __forceinline__ void grouped_schedule_build(const int32_t* offsets, int E, int* s_off, int* s_tiles) {
  __shared__ int s_warp[THREADS / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e <= E; e += THREADS) s_off[e] = offsets[e];
  __syncthreads();
  const int per = (E + THREADS - 1) / THREADS, e0 = min(tid * per, E), e1 = min(e0 + per, E);
  int local = 0;
  for (int e = e0; e < e1; ++e) local += (s_off[e + 1] - s_off[e] + BM - 1) / BM;
  int incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; ++w) before += s_warp[w];
  int run = before + incl - local;
  for (int e = e0; e < e1; ++e) {
    s_tiles[e] = run;
    run += (s_off[e + 1] - s_off[e] + BM - 1) / BM;
  }
  if (tid == THREADS - 1) s_tiles[E] = before + incl;
  __syncthreads();
}

struct GroupedTile {
  int e, row0, row_end, n0;
};

// Tile t -> (expert, first row, expert's end row, first column); n fastest, so the blocks working at
// the same time share an expert's rows and W_e in L2.
template <int BM, int BN>
__device__ __forceinline__ GroupedTile grouped_tile(int64_t t, int ntn, const int* s_off, const int* s_tiles, int E) {
  const int mt = static_cast<int>(t / ntn);
  GroupedTile x;
  x.n0 = static_cast<int>(t % ntn) * BN;
  int lo = 0, hi = E;  // largest e with s_tiles[e] <= mt (empty experts share their successor's prefix)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (s_tiles[mid] <= mt)
      lo = mid;
    else
      hi = mid;
  }
  x.e = lo;
  x.row0 = s_off[lo] + (mt - s_tiles[lo]) * BM;
  x.row_end = s_off[lo + 1];
  return x;
}

}  // namespace mt::cuda
