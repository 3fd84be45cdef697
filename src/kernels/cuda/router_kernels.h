// Raw launchers of the router kernels (router.cu), called by router.cpp after its checks. Pointers are
// device pointers; every launch is queued on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mt::cuda::detail {

constexpr int kRouterWarps = 8;  // warps (one token each at a time) per router block

// topk_softmax: GPT-OSS's router (top-k of the logits, softmax over the k; `norm` unused), else Qwen's.
void router_forward_launch(const void* logits, bool logits_bf16, int T, int E, int k, bool norm, bool bf16_mode,
                           bool topk_softmax, int tokens_per_block, int blocks, int32_t* index, float* weights,
                           int32_t* part_count, float* part_psum, cudaStream_t stream);
void aux_stats_reduce_launch(const int32_t* part_count, const float* part_psum, int rows, int E, int32_t* count,
                             float* psum, cudaStream_t stream);
void aux_loss_finish_launch(const int32_t* count, const float* psum, int E, double rows, bool bf16_mode, double daux,
                            float* aux, float* aux_dp, cudaStream_t stream);
void router_backward_launch(const float* dweights, const void* logits, bool logits_bf16, const int32_t* index,
                            const float* aux_dp, int T, int E, int k, bool norm, bool bf16_mode, bool topk_softmax,
                            void* dlogits, bool dlogits_bf16, cudaStream_t stream);

void router_balanced_index_launch(int32_t* index, int64_t T, int k, int E, cudaStream_t stream);
// router.h's routing fault probe: index[t][k-1] of every `every`-th token -> its best unselected expert.
void router_fault_index_launch(int32_t* index, const void* logits, bool logits_bf16, int64_t T, int k, int E, int every,
                               cudaStream_t stream);

}  // namespace mt::cuda::detail
