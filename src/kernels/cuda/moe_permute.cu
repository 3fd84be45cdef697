#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/moe_permute_kernels.h"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

// The plan is a stable counting sort in three launches: per-chunk expert histograms; one block that
// scans them (per expert over chunks, then over experts -> offsets); per-chunk scatter that ranks each
// slot among the earlier slots of its expert in the chunk (warp __match_any_sync + per-warp counts in
// shared memory). Row copies move 16 bytes per lane when rows are 16-byte aligned, else one element.

namespace mt::cuda {

namespace {

using mma::bf16;
constexpr int kPlanThreads = 256;
constexpr int kPlanWarps = kPlanThreads / 32;

__device__ __forceinline__ int clamp_expert(int e, int E) { return e < 0 ? 0 : (e >= E ? E - 1 : e); }

__global__ void __launch_bounds__(kPlanThreads)
    plan_count_kernel(const int32_t* __restrict__ index, int64_t N, int E, int32_t* __restrict__ chunk_counts) {
  pdl_wait();
  extern __shared__ int s_count[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) s_count[e] = 0;
  __syncthreads();
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * detail::kPlanChunk;
  const int64_t c1 = min(N, c0 + detail::kPlanChunk);
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) atomicAdd(&s_count[clamp_expert(index[i], E)], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_counts[static_cast<int64_t>(blockIdx.x) * E + e] = s_count[e];
}

// One block of 1024 threads (E <= 1024): chunk_counts[c][e] becomes the exclusive prefix over chunks
// (the chunk's first rank inside expert e), and offsets[e] the exclusive prefix of the totals.
__global__ void __launch_bounds__(1024)
    plan_scan_kernel(int32_t* __restrict__ chunk_counts, int chunks, int E, int32_t* __restrict__ offsets) {
  pdl_wait();
  __shared__ int s_scan[1024];
  const int e = threadIdx.x;
  int run = 0;
  if (e < E) {
    for (int c = 0; c < chunks; ++c) {
      int32_t* p = chunk_counts + static_cast<int64_t>(c) * E + e;
      const int v = *p;
      *p = run;
      run += v;
    }
  }
  s_scan[e] = e < E ? run : 0;
  __syncthreads();
  // Hillis-Steele inclusive scan over the expert totals.
  for (int d = 1; d < 1024; d <<= 1) {
    const int v = e >= d ? s_scan[e - d] : 0;
    __syncthreads();
    s_scan[e] += v;
    __syncthreads();
  }
  if (e < E) offsets[e + 1] = s_scan[e];
  if (e == 0) offsets[0] = 0;
}

__global__ void __launch_bounds__(kPlanThreads)
    plan_scatter_kernel(const int32_t* __restrict__ index, int64_t N, int E, const int32_t* __restrict__ chunk_base,
                        const int32_t* __restrict__ offsets, int32_t* __restrict__ row_of_slot,
                        int32_t* __restrict__ slot_of_row) {
  pdl_wait();
  extern __shared__ int smem[];
  int* s_run = smem;       // [E] slots of expert e already placed from this chunk
  int* s_warp = smem + E;  // [kPlanWarps][E] this round's count of expert e in each warp
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * detail::kPlanChunk;
  const int64_t c1 = min(N, c0 + detail::kPlanChunk);
  for (int i = threadIdx.x; i < E * (kPlanWarps + 1); i += blockDim.x) smem[i] = 0;
  __syncthreads();
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int64_t base = c0; base < c1; base += kPlanThreads) {
    const int64_t slot = base + threadIdx.x;
    const bool valid = slot < c1;
    const int e = valid ? clamp_expert(index[slot], E) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int wrank = __popc(peers & lt_mask);
    if (valid && wrank == 0) s_warp[warp * E + e] = __popc(peers);
    __syncthreads();
    if (valid) {
      int rank = s_run[e] + wrank;
      for (int w = 0; w < warp; ++w) rank += s_warp[w * E + e];
      const int row = offsets[e] + chunk_base[static_cast<int64_t>(blockIdx.x) * E + e] + rank;
      row_of_slot[slot] = row;
      slot_of_row[row] = static_cast<int32_t>(slot);
    }
    __syncthreads();
    for (int x = threadIdx.x; x < E; x += blockDim.x) {
      int add = 0;
      for (int w = 0; w < kPlanWarps; ++w) add += s_warp[w * E + x], s_warp[w * E + x] = 0;
      s_run[x] += add;
    }
    __syncthreads();
  }
}

// U consecutive elements <-> floats. U = 8 (one 16-byte bf16 vector) or 1.
template <int U>
__device__ __forceinline__ void load_u(const bf16* p, float (&v)[U]) {
  if constexpr (U == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  } else {
    v[0] = __bfloat162float(*p);
  }
}
template <int U>
__device__ __forceinline__ void load_u(const float* p, float (&v)[U]) {
  if constexpr (U == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    v[0] = *p;
  }
}
template <int U>
__device__ __forceinline__ void store_u(bf16* p, const float (&v)[U]) {
  if constexpr (U == 8) {
    uint4 raw;
    uint32_t* w = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = mma::pack_bf16(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
    *p = __float2bfloat16_rn(v[0]);
  }
}
template <int U>
__device__ __forceinline__ void store_u(float* p, const float (&v)[U]) {
  if constexpr (U == 8) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    *p = v[0];
  }
}

__device__ __forceinline__ float round_bf16_dev(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// One warp per grouped row: xg[r] = x[slot_of_row[r] / k], for r < N and (with a row_limit) r < *row_limit.
template <int U>
__global__ void gather_kernel(const bf16* __restrict__ x, int64_t N, const int32_t* __restrict__ row_limit, int H,
                              int k, const int32_t* __restrict__ slot_of_row, bf16* __restrict__ xg) {
  pdl_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= N || (row_limit && r >= *row_limit)) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = slot_of_row[r] / k;
  const bf16* src = x + t * H;
  bf16* dst = xg + r * H;
  for (int h = lane * U; h < H; h += 32 * U) {
    if constexpr (U == 8)
      *reinterpret_cast<uint4*>(dst + h) = *reinterpret_cast<const uint4*>(src + h);
    else
      dst[h] = src[h];
  }
}

// One warp per token: out[t] = Σ_s (bf16(w·y[row]) | w·y[row] | y[row]), fp32 sum, rounded once for a bf16 output.
// The whole warp walks H together (lanes past H stay in step) because the slot loop uses shuffles.
template <int U, bool WEIGHTED, typename Tout>
__global__ void combine_kernel(const bf16* __restrict__ y, const float* __restrict__ weights,
                               const int32_t* __restrict__ row_of_slot, const int32_t* __restrict__ row_limit,
                               int64_t T, int k, int H, Tout* __restrict__ out, bool round_product) {
  pdl_wait();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= T) return;
  const int lane = threadIdx.x & 31;
  // Row ids and weights of the k slots, read once into registers of lanes 0..k-1, then broadcast to
  // per-slot registers: k <= 32.
  // Slots whose row is at or past *row_limit belong to another rank's experts (a local plan): -1, skipped.
  const int limit = row_limit ? *row_limit : INT32_MAX;
  int my_row = lane < k ? row_of_slot[t * k + lane] : 0;
  if (my_row >= limit) my_row = -1;
  const float my_w = (WEIGHTED && lane < k) ? weights[t * k + lane] : 0.0f;
  for (int h0 = 0; h0 < H; h0 += 32 * U) {
    const int h = h0 + lane * U;
    const bool active = h < H;
    float acc[U];
#pragma unroll
    for (int i = 0; i < U; ++i) acc[i] = 0.0f;
    for (int s = 0; s < k; ++s) {
      const int64_t r = __shfl_sync(0xffffffffu, my_row, s);
      const float w = WEIGHTED ? __shfl_sync(0xffffffffu, my_w, s) : 1.0f;
      if (active && r >= 0) {
        float v[U];
        load_u<U>(y + r * H + h, v);
#pragma unroll
        for (int i = 0; i < U; ++i) acc[i] += WEIGHTED ? (round_product ? round_bf16_dev(v[i] * w) : v[i] * w) : v[i];
      }
    }
    if (active) store_u<U>(out + t * H + h, acc);
  }
}

// One warp per slot (t, s): dy[row] = bf16(dout[t] · w) and dweights[t, s] = Σ_h dout[t, h] · y[row, h].
template <int U, bool WEIGHTED, typename Tin>
__global__ void combine_backward_kernel(const Tin* __restrict__ dout, const bf16* __restrict__ y,
                                        const float* __restrict__ weights, const int32_t* __restrict__ row_of_slot,
                                        const int32_t* __restrict__ row_limit, int64_t N, int k, int H,
                                        bf16* __restrict__ dy, float* __restrict__ dweights) {
  pdl_wait();
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (slot >= N) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = slot / k, r = row_of_slot[slot];
  if (row_limit && r >= *row_limit) {  // another rank's expert: no row here, no weight gradient from here
    if (WEIGHTED && lane == 0) dweights[slot] = 0.0f;
    return;
  }
  const float w = WEIGHTED ? weights[slot] : 1.0f;
  float dot = 0.0f;
  for (int h = lane * U; h < H; h += 32 * U) {
    float g[U];
    load_u<U>(dout + t * H + h, g);
    if constexpr (WEIGHTED) {
      float v[U], d[U];
      load_u<U>(y + r * H + h, v);
#pragma unroll
      for (int i = 0; i < U; ++i) dot += g[i] * v[i], d[i] = g[i] * w;
      store_u<U>(dy + r * H + h, d);
    } else {
      store_u<U>(dy + r * H + h, g);
    }
  }
  if constexpr (WEIGHTED) {
    dot = mma::warp_sum(dot);
    if (lane == 0) dweights[slot] = dot;
  }
}

// Expert ids -> a local plan's ids: [first, first + count) -> [0, count), every other id -> count.
__global__ void local_ids_kernel(const int32_t* __restrict__ index, int64_t N, int first, int count,
                                 int32_t* __restrict__ out) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const int e = index[i] - first;
  out[i] = (e >= 0 && e < count) ? e : count;
}


constexpr int kRowWarps = 8;  // warps per block of the row kernels
int row_blocks(int64_t rows) { return static_cast<int>((rows + kRowWarps - 1) / kRowWarps); }

}  // namespace

namespace detail {

void moe_plan_launch(const int32_t* index, int64_t N, int E, int32_t* chunk_counts, int32_t* offsets,
                     int32_t* row_of_slot, int32_t* slot_of_row, cudaStream_t stream) {
  const int chunks = static_cast<int>((N + kPlanChunk - 1) / kPlanChunk);
  if (chunks > 0) {
    launch_kernel(plan_count_kernel, chunks, kPlanThreads, E * sizeof(int), stream, index, N, E, chunk_counts);
  }
  launch_kernel(plan_scan_kernel, 1, 1024, 0, stream, chunk_counts, chunks, E, offsets);
  if (chunks > 0) {
    launch_kernel(plan_scatter_kernel, chunks, kPlanThreads, E*(kPlanWarps + 1) * sizeof(int), stream, index, N, E,
        chunk_counts, offsets, row_of_slot, slot_of_row);
  }
}

void moe_local_ids_launch(const int32_t* index, int64_t N, int first, int count, int32_t* out,
                          cudaStream_t stream) {
  if (N == 0) return;
  launch_kernel(local_ids_kernel, static_cast<int>((N + 255) / 256), 256, 0, stream, index, N, first, count, out);
}

void moe_gather_launch(const void* x, int64_t N, const int32_t* row_limit, int H, int k, const int32_t* slot_of_row,
                       void* xg, cudaStream_t stream) {
  if (N == 0 || H == 0) return;
  const bf16* xs = static_cast<const bf16*>(x);
  bf16* xd = static_cast<bf16*>(xg);
  if (H % 8 == 0 && aligned16(x) && aligned16(xg))
    launch_kernel(gather_kernel<8>, row_blocks(N), kRowWarps * 32, 0, stream, xs, N, row_limit, H, k, slot_of_row, xd);
  else
    launch_kernel(gather_kernel<1>, row_blocks(N), kRowWarps * 32, 0, stream, xs, N, row_limit, H, k, slot_of_row, xd);
}

void moe_combine_launch(const void* y, const float* weights, const int32_t* row_of_slot, const int32_t* row_limit,
                        int64_t T, int k, int H, void* out, bool out_f32, cudaStream_t stream, bool round_product) {
  if (T == 0 || H == 0) return;
  const bf16* ys = static_cast<const bf16*>(y);
  const bool vec = H % 8 == 0 && aligned16(y) && aligned16(out);
  auto go = [&](auto u_c, auto w_c, auto* o) {
    constexpr int U = decltype(u_c)::value;
    constexpr bool W = decltype(w_c)::value;
    using Tout = std::remove_pointer_t<decltype(o)>;
    launch_kernel(combine_kernel<U, W, Tout>, row_blocks(T), kRowWarps * 32, 0, stream, ys, weights, row_of_slot,
        row_limit, T, k, H, o, round_product);
  };
  auto with_out = [&](auto u_c, auto w_c) {
    if (out_f32)
      go(u_c, w_c, static_cast<float*>(out));
    else
      go(u_c, w_c, static_cast<bf16*>(out));
  };
  auto with_w = [&](auto u_c) {
    if (weights)
      with_out(u_c, std::true_type{});
    else
      with_out(u_c, std::false_type{});
  };
  if (vec)
    with_w(std::integral_constant<int, 8>{});
  else
    with_w(std::integral_constant<int, 1>{});
}

void moe_combine_backward_launch(const void* dout, bool dout_f32, const void* y, const float* weights,
                                 const int32_t* row_of_slot, const int32_t* row_limit, int64_t T, int k, int H,
                                 void* dy, float* dweights, cudaStream_t stream) {
  const int64_t N = T * k;
  if (N == 0) return;
  const bf16* ys = static_cast<const bf16*>(y);
  bf16* dys = static_cast<bf16*>(dy);
  const bool vec = H % 8 == 0 && aligned16(dout) && aligned16(dy) && (!weights || aligned16(y));
  auto go = [&](auto u_c, auto w_c, auto* g) {
    constexpr int U = decltype(u_c)::value;
    constexpr bool W = decltype(w_c)::value;
    using Tin = std::remove_const_t<std::remove_pointer_t<decltype(g)>>;
    launch_kernel(combine_backward_kernel<U, W, Tin>, row_blocks(N), kRowWarps * 32, 0, stream, g, ys, weights,
        row_of_slot, row_limit, N, k, H, dys, dweights);
  };
  auto with_in = [&](auto u_c, auto w_c) {
    if (dout_f32)
      go(u_c, w_c, static_cast<const float*>(dout));
    else
      go(u_c, w_c, static_cast<const bf16*>(dout));
  };
  auto with_w = [&](auto u_c) {
    if (weights)
      with_in(u_c, std::true_type{});
    else
      with_in(u_c, std::false_type{});
  };
  if (vec)
    with_w(std::integral_constant<int, 8>{});
  else
    with_w(std::integral_constant<int, 1>{});
}

}  // namespace detail
}  // namespace mt::cuda
