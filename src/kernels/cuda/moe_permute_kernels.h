// Raw launchers of the permutation kernels (moe_permute.cu), called by moe_permute.cpp after its checks.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mt::cuda::detail {

constexpr int kPlanChunk = 2048;  // slots per block of the counting sort

// chunk_counts: int32 scratch of [ceil(N / kPlanChunk), E].
void moe_plan_launch(const int32_t* index, int64_t N, int E, int32_t* chunk_counts, int32_t* offsets,
                     int32_t* row_of_slot, int32_t* slot_of_row, cudaStream_t stream);

void moe_gather_launch(const void* x, int64_t N, int H, int k, const int32_t* slot_of_row, void* xg,
                       cudaStream_t stream);

// weights may be null (plain sum). out_f32 selects the output dtype (else bf16).
void moe_combine_launch(const void* y, const float* weights, const int32_t* row_of_slot, int64_t T, int k, int H,
                        void* out, bool out_f32, cudaStream_t stream);

// weights may be null (then dweights is not written). dout_f32 selects dout's dtype (else bf16).
void moe_combine_backward_launch(const void* dout, bool dout_f32, const void* y, const float* weights,
                                 const int32_t* row_of_slot, int64_t T, int k, int H, void* dy, float* dweights,
                                 cudaStream_t stream);

}  // namespace mt::cuda::detail
