// ReLU² (Transformers' ACT2FN["relu2"]: square(relu(u))), Nemotron-H's dense MLPs, shared expert and routed experts:
// one input (the up projection; no gate), a = relu(u)², da/du = 2·relu(u). The CPU twin is kernels/cpu/relu2.h.
// BF16: the square computed in fp32 and rounded once (relu is exact), as the CPU's bf16 mode; F32: plain fp32. The
// backward is fp32 math on the saved u, rounded once to the dtype. No transcendental function on either side, so the
// GPU gives the CPU's bits (the backward's bf16 output is the CPU's fp32 result rounded once).
// No routing weight: the MoE block applies the routing weights in its combine (moe_permute.h), as for SwiGLU there.
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

// u [N, F] (BF16|F32) -> out [N, F] same dtype. N·F may be 0. out may alias u.
void relu2_forward(const Tensor& u, Tensor& out, cudaStream_t stream);

// dout, u [N, F] -> du [N, F] (overwritten): du = u > 0 ? 2u·dout : 0. du may alias dout.
void relu2_backward(const Tensor& dout, const Tensor& u, Tensor& du, cudaStream_t stream);

}  // namespace mt::cuda
