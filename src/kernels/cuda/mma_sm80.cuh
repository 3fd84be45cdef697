// Tensor-core building blocks shared by the grouped GEMM and flash attention (sm_80+): cp.async
// global->shared copies, ldmatrix fragment loads, mma.sync m16n8k16 (bf16 in, fp32 accumulate), the
// XOR swizzle of shared tiles, and small warp reductions. Device code only; include from .cu files.
//
// Fragment layout of mma.m16n8k16 (g = lane / 4, q = lane % 4), used throughout:
//   A 16x16 (4 regs of bf16x2): a0 (row g, cols 2q..2q+1), a1 (row g+8), a2 (row g, cols 8+2q..), a3 (row g+8, 8+2q..)
//   B 16x8  (2 regs):           b0 (k 2q..2q+1, col g),    b1 (k 8+2q..8+2q+1, col g)
//   C 16x8  (4 floats):         c0,c1 (row g, cols 2q, 2q+1), c2,c3 (row g+8, same cols)
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace mt::cuda::mma {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy; when !valid the 16 shared bytes are zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two 8x8 matrices, transposed (addresses from lanes 0..15: lanes 0..7 matrix 0, 8..15 matrix 1).
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// c += a · b, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> bf16x2 (round to nearest even), low half = first.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Byte offset of element (row, col) in a shared tile of `chunks` 16-byte chunks per row (8 bf16 each),
// with the 16-byte chunk index XOR-swizzled by row % 8. Needs chunks % 8 == 0; then the 8 rows read by
// one ldmatrix 8x8 matrix (same logical chunk) land in 8 different bank groups.
__device__ __forceinline__ uint32_t swz(int row, int col, int chunks) {
  return static_cast<uint32_t>((row * chunks + ((col >> 3) ^ (row & 7))) * 16 + (col & 7) * 2);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace mt::cuda::mma
