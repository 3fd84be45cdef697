// Raw launchers of the sigmoid group router (router_sigmoid_group.cu), called by router_sigmoid_group.cpp after its
// checks. Pointers are device pointers; every launch is queued on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mt::cuda::detail {

// bias may be null (zeros); load may be null (no counts).
void router_sigmoid_group_forward_launch(const void* logits, bool logits_bf16, const float* bias, int T, int E, int k,
                                         int groups, int topk_groups, bool norm, float scale, int32_t* index,
                                         float* weights, int32_t* load, cudaStream_t stream);
void router_sigmoid_group_backward_launch(const float* dweights, const void* logits, bool logits_bf16,
                                          const int32_t* index, int T, int E, int k, bool norm, float scale,
                                          void* dlogits, bool dlogits_bf16, cudaStream_t stream);
void router_expert_load_launch(const int32_t* index, int64_t slots, int E, int32_t* load, cudaStream_t stream);

}  // namespace mt::cuda::detail
