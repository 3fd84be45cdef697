// Raw launchers of the permutation kernels (moe_permute.cu), called by moe_permute.cpp after its checks.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mt::cuda::detail {

constexpr int kPlanChunk = 2048;  // slots per block of the counting sort

// chunk_counts: int32 scratch of [ceil(N / kPlanChunk), E].
void moe_plan_launch(const int32_t* index, int64_t N, int E, int32_t* chunk_counts, int32_t* offsets,
                     int32_t* row_of_slot, int32_t* slot_of_row, cudaStream_t stream);

// Rows r < N, and r < *row_limit when row_limit (device) is not null.
void moe_gather_launch(const void* x, int64_t N, const int32_t* row_limit, int H, int k, const int32_t* slot_of_row,
                       void* xg, cudaStream_t stream);

// out[i] = index[i] - first when that is in [0, count), else count (the bucket of other ranks' experts).
void moe_local_ids_launch(const int32_t* index, int64_t N, int first, int count, int32_t* out, cudaStream_t stream);

// weights may be null (plain sum). out_f32 selects the output dtype (else bf16). row_limit (device, may be
// null): slots whose row is >= *row_limit are skipped.
void moe_combine_launch(const void* y, const float* weights, const int32_t* row_of_slot, const int32_t* row_limit,
                        int64_t T, int k, int H, void* out, bool out_f32, cudaStream_t stream,
                        bool round_product = true);

// weights may be null (then dweights is not written). dout_f32 selects dout's dtype (else bf16). row_limit as
// for the combine: a skipped slot writes no dy row and a zero dweight.
void moe_combine_backward_launch(const void* dout, bool dout_f32, const void* y, const float* weights,
                                 const int32_t* row_of_slot, const int32_t* row_limit, int64_t T, int k, int H,
                                 void* dy, float* dweights, cudaStream_t stream);

}  // namespace mt::cuda::detail
