// The sparse MoE block on the GPU (CPU twin: layers/moe_block.h), given its sublayer spec (experts, k,
// expert size, router, shared expert), without a host sync:
//   logits = router(n); top-k routing (fused softmax/top-k/renorm, aux statistics on the device);
//   tokens permuted into the expert-contiguous layout; gate_up = grouped GEMM; h = SwiGLU (or GPT-OSS's clamped
//   form; or ReLU² on up alone, Nemotron-H: experts_gate_up [E, I, H], the first GEMM I wide);
//   y_e = grouped GEMM (down); out = Σ_slots w · y_e       (the residual add is fused into the next norm)
// Routers: Qwen3-MoE's softmax then top-k, GPT-OSS's top-k then softmax (bf16 logits of a bf16 GEMM), DeepSeek-V3's
// sigmoid group-limited top-k (kernels/cuda/router_sigmoid_group.h): fp32 logits (the bf16 operands' GEMM with fp32
// output, as Transformers' F.linear(x.float(), W.float())), the fp32 e_score_correction_bias steering the selection
// (a buffer: no gradient), fp32 routing weights, so each w · y_e stays fp32 and only the sum is rounded. Its backward
// takes bf16 d(logits) into the router's two bf16 GEMMs (one more rounding than Transformers' fp32 linear backward).
// A shared expert (DeepSeek-V3's SwiGLU, Nemotron-H's ReLU²) is the dense MLP block (layers/cuda/mlp_block_cuda.h) on
// the same n, its output added to the routed sum in bf16 (Transformers' bf16 add); its input gradient joins dn in its
// own dgrad GEMMs.
// The cheap tensors (n, the gathered input xg, h, the shared expert's activation) may be dropped after the forward
// and recomputed.
// Under expert parallelism (env.ep) the expert GEMMs run on this rank's experts only
// (layers/cuda/expert_parallel_cuda.h). all_gather mode: the plan is a local plan over the group's
// gathered tokens (n_all, w_all kept for the backward; xg is cheap again, gathered from n_all).
// all_to_all mode: xg holds the rows every rank sent (expert-major) and is kept, since recomputing it
// would mean dispatching again.
#pragma once
#include "core/tensor.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/router.h"
#include "layers/cuda/cuda_block_env.h"
#include "layers/cuda/expert_parallel_cuda.h"
#include "layers/cuda/expert_wgrad_passes.h"
#include "layers/cuda/mlp_block_cuda.h"
#include "models/model_weights.h"

namespace mt {

struct MoeActsCuda {
  Tensor n;                  // [T, H] normalised input
  Tensor logits;             // [T, E] router logits (BF16; F32 for the sigmoid group router)
  cuda::RouterResult route;  // index I32 [T, k], weights F32 [T, k]
  cuda::MoePlan plan;        // expert-contiguous layout (device offsets); all_gather EP: the local plan
  Tensor n_all, w_all;       // all_gather EP: the group's n [ep·T, H] and routing weights F32 [ep·T, k]
  Tensor xg;                 // [N, H] the expert GEMMs' input rows (N = T·k; under EP: room for this rank's
                             // experts' rows, all_gather: the live count on the device, plan.offsets)
  Tensor gu;                 // [N, 2I] gate|up ([N, I] up for ReLU²)
  Tensor h;                  // [N, I] activation output
  Tensor yd;                 // [T·k, H] expert outputs before the routing weights, in plan order
  Tensor expert_offsets;     // I32: the grouped GEMMs' offsets (plan.offsets, or the EP layout's local ones)
  EpDispatch ep;             // under EP: this micro-batch's row counts per group rank
  // LoRA on the expert stacks (env.lora): each adapter's u = bf16(input_e·A'_eᵀ), BF16 [N, r], kept.
  Tensor u_gate_up, u_down;
  MlpActsCuda shared;  // the shared expert's (MoeSpec::shared_expert)
};

// The shared expert's dims and weights (LoRA slots shared_*), for the dense MLP block.
MlpDimsCuda moe_shared_dims(const DecoderSpec& cfg, const MoeSpec& spec);
MlpWeightsCuda moe_shared_weights(const LayerWeights& w);
MlpGradsCuda moe_shared_grads(LayerWeights& g);

// n -> out BF16 [T, H]. stats: this layer's aux statistics are added (null: none, e.g. a recompute).
Tensor moe_block_forward_cuda(const CudaBlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& n,
                              cuda::AuxStats* stats, MoeActsCuda& acts);
void moe_acts_drop_cheap(MoeActsCuda& acts);  // drops n, xg, h (and the shared expert's n and h)
// Recomputes what moe_acts_drop_cheap dropped; x is the block input (before its norm, post_norm).
void moe_acts_restore(const CudaBlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& x,
                      MoeActsCuda& acts);
// dout BF16 [T, H] -> dn BF16 [T, H] (gradient of the normalised input). aux_dp (F32 [E] or undefined):
// the aux-loss gradient w.r.t. the router probabilities. Parameter gradients are added into g; the
// expert weights' go through `passes` (layer `layer`: pairing, first-pass overwrite). An undefined gradient is
// a frozen parameter (LoRA): not computed. The expert adapters' gradients go to env.dlora.
// dout_all (all_gather EP, optional): dout's all-gather already started (ep_all_gather_async); it is
// joined here instead of gathering again.
Tensor moe_block_backward_cuda(const CudaBlockEnv& env, const MoeSpec& spec, const LayerWeights& w,
                               const MoeActsCuda& acts, const Tensor& dout, const Tensor& aux_dp, LayerWeights& g,
                               ExpertWgradPasses& passes, int64_t layer, EpPending* dout_all = nullptr);

}  // namespace mt
