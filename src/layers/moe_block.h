// Sparse MoE block (hf-numerics.md §3.2, §4.2, §5.3): n = post_norm(h); logits = router(n); top-k routing;
// y = h + Σ_slots w · expert(n) [+ shared(n)].
// Routers: softmax then top-k (Qwen3-MoE), top-k then softmax with a biased router (GPT-OSS), or DeepSeek-V3's sigmoid
// with group-limited top-k: fp32 logits (the router GEMM in fp32 even in a bf16 model), the fp32 correction bias
// steering the selection only, fp32 routing weights (so the experts' combine rounds once, cpu::ExpertsVariant).
// A shared expert (DeepSeek-V3: SwiGLU; Nemotron-H: ReLU² without a gate) is an MLP on the same n, added to the
// routed output: in bf16 the routed sum is rounded, then the bf16 add, then the residual add. Nemotron-H's routed
// experts are ReLU² too, up/down only (cpu::ExpertActivation::relu2).
#pragma once
#include "core/tensor.h"
#include "kernels/cpu/experts.h"
#include "kernels/cpu/router.h"
#include "layers/block_env.h"
#include "layers/expert_parallel.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"

namespace mt {

struct MoeBlockActs {
  Tensor n;                   // [T, H] normalised input
  Tensor logits;              // [T, E] router logits (bf16 values in bf16 mode): also the aux-loss input
  cpu::RouterOutput route;
  cpu::ExpertsSaved experts;
  EpExpertsSaved ep_experts;  // instead of `experts` under expert parallelism (env.ep)
  Tensor shared_gate, shared_up, shared_act;  // [T, Fs] the shared expert's (MoeSpec::shared_expert; no gate: ReLU²)
};

// h F32 [T, H] -> y F32 [T, H]. acts may be null (forward only) unless the caller wants the logits.
// lora (optional): per-expert adapters on the two expert stacks and adapters on the shared expert's projections (the
// router is never adapted).
Tensor moe_block_forward(const BlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& h,
                         MoeBlockActs* acts, const LayerLora* lora = nullptr);
// dy [T, H] -> dh [T, H] (including the residual). dlogits_extra F32 [T, E] (e.g. the aux-loss
// gradient w.r.t. this layer's router logits) is added before the router backward; may be undefined.
// Undefined gradient tensors in g are frozen parameters (not computed); with lora, the adapters' gradients go to
// dlora. Adapters under expert parallelism are refused (the trainer says so first).
Tensor moe_block_backward(const BlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& h,
                          const MoeBlockActs& acts, const Tensor& dy, const Tensor& dlogits_extra,
                          LayerWeights& g, const LayerLora* lora = nullptr, LayerLora* dlora = nullptr);

}  // namespace mt
