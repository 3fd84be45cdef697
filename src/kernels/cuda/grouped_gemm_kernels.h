// Raw launchers of the grouped expert GEMM (grouped_gemm.cu), called by grouped_gemm.cpp after its checks.
// All matrices are row-major bf16 (dw fp32); offsets is the device array [E + 1] of moe_plan.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mt::cuda::detail {

// y [rows][N] = x [rows][K] · w_eᵀ, w [E][N][K]. `rows` (host) bounds offsets[E] and sizes the grid.
void grouped_gemm_fwd_launch(const void* x, const void* w, void* y, const int32_t* offsets, int E, int64_t rows, int N,
                             int K, int sm_count, cudaStream_t stream);
// dx [rows][K] = dy [rows][J] · w_e, w [E][J][K].
void grouped_gemm_dgrad_launch(const void* dy, const void* w, void* dx, const int32_t* offsets, int E, int64_t rows,
                               int J, int K, int sm_count, cudaStream_t stream);
// dw [E][M][N] (+)= dy_eᵀ · x_e, dy [rows][M], x [rows][N].
// dy2/x2/offsets2 (optional, all or none): a second segment of rows reduced into the same dW pass.
void grouped_gemm_wgrad_launch(const void* dy, const void* x, void* dw, bool dw_bf16, const int32_t* offsets, int E,
                               int M, int N, bool accumulate, int sm_count, cudaStream_t stream,
                               const void* dy2 = nullptr, const void* x2 = nullptr,
                               const int32_t* offsets2 = nullptr);

// Hopper kernels (grouped_gemm_sm90.cu: TMA + wgmma), same contracts as grouped_gemm_fwd_launch and
// grouped_gemm_dgrad_launch; operands must be 16-byte aligned (TMA) and rows < 2^31. They throw unless
// grouped_gemm_sm90_compiled().
// tile_counter: null for the static schedule (block b takes tiles b, b + grid, ...), else one device int, zero
// when the kernel starts, used by this launch only: the blocks claim their tiles from it (grouped_gemm_sm90_dynamic).
void grouped_gemm_fwd_sm90_launch(const void* x, const void* w, void* y, const int32_t* offsets, int E, int64_t rows,
                                  int N, int K, int sm_count, int* tile_counter, cudaStream_t stream);
void grouped_gemm_dgrad_sm90_launch(const void* dy, const void* w, void* dx, const int32_t* offsets, int E,
                                    int64_t rows, int J, int K, int sm_count, int* tile_counter, cudaStream_t stream);
// Whether grouped_gemm_forward / _dgrad give the Hopper kernels a tile counter (claimed tiles instead of the static
// walk): set (1 on, 0 off, -1 back to the environment) for tests and the bench, else MIXTUNE_GROUPED_DYNAMIC=1
// (read once). Off by default: no change in the standard step, 2-15% slower with balanced routing, 2-8%
// faster with skewed routing (bench/NOTES.md 80). Process-wide.
void grouped_gemm_sm90_dynamic_set(int on);
bool grouped_gemm_sm90_dynamic();
// dw [E][M][N] (+)= dy_eᵀ · x_e as grouped_gemm_wgrad_launch; `rows` / `rows2` are the row counts of
// dy/x and dy2/x2 (the tensor maps' extents). `tile_counter`: one device int, zero when the kernel starts
// (the blocks take their tiles from it), used by this launch only.
void grouped_gemm_wgrad_sm90_launch(const void* dy, const void* x, int64_t rows, void* dw, bool dw_bf16,
                                    const int32_t* offsets, int E, int M, int N, bool accumulate, int sm_count,
                                    int* tile_counter, cudaStream_t stream, const void* dy2 = nullptr, const void* x2 = nullptr,
                                    int64_t rows2 = 0, const int32_t* offsets2 = nullptr);
// True when the current device would run the sm_90a build of those kernels (a cc 9.0 GPU and a build
// with 90a in CMAKE_CUDA_ARCHITECTURES).
bool grouped_gemm_sm90_compiled();
// The bench's mainloop probes of the Hopper kernels' 256-wide tile (process-wide; stages 0 = off, the
// shape's choice): 3 or 4 stages (forward and dgrad); forward only, without output stores (store = false: the
// tiles are computed and nothing is stored) or 4 stages without TMA loads (load = false: the MMAs read
// whatever the stages hold); or (bn = 384, forward and dgrad) a 128 x 384 tile, 3 stages: 98 FLOP per byte loaded
// against the 256-wide tile's 85.
// Other choices throw; the stage, store and load probes leave a shape that picks the 128-wide tile as it is. A probe
// without stores or loads leaves garbage (or nothing) in the output.
struct GroupedSm90Probe {
  int stages = 0;
  bool store = true, load = true;
  int bn = 0;
};
void grouped_gemm_sm90_probe_set(GroupedSm90Probe p);
GroupedSm90Probe grouped_gemm_sm90_probe_get();

// Which kernel grouped_gemm_forward, _dgrad and _wgrad(2) run. Auto: the wgmma one on a cc 9.x device
// when grouped_gemm_sm90_compiled() and the environment does not say MIXTUNE_GROUPED_GEMM=mma (read
// once), else mma.sync. Wgmma forces it (an error where it cannot run); tests and the bench use this.
// Process-wide.
enum class GroupedFwdKernel { Auto, MmaSync, Wgmma };
void grouped_gemm_fwd_kernel_set(GroupedFwdKernel k);
GroupedFwdKernel grouped_gemm_fwd_kernel_get();

}  // namespace mt::cuda::detail
