// Fused top-k routers of Qwen3-MoE and GPT-OSS on the GPU (the CPU twin is kernels/cpu/router.h + aux_loss.h):
// after the router GEMM, one warp per token does softmax (fp32) -> top-k -> optional renormalisation
// -> routing weights, and gathers the load-balancing statistics (per-expert top-k counts and the sum of
// the router probabilities) without a host sync. Backward recomputes the softmax from the logits.
//
// Tie rule as on the CPU: equal probabilities go to the lower expert index; NaN ranks above numbers.
// Limits: E <= 1024 experts, 1 <= top_k <= min(E, 32). Every call is asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

struct RouterResult {
  Tensor index;    // I32 [T, k] selected experts, by descending probability
  Tensor weights;  // F32 [T, k] routing weights (after renormalisation; bf16-rounded values in bf16 mode)
};

// Aux-loss statistics of one optimizer step, summed over every MoE layer (hf-numerics.md §1.5):
// count[e] = rows whose top-k holds e, psum[e] = Σ p[·, e]. In bf16 mode both use the bf16-rounded
// probabilities and their own top-k, as HF's load_balancing_loss_func does. `rows` is host-side
// (tokens × layers added so far), known without reading the device.
struct AuxStats {
  Tensor count;  // I32 [E]
  Tensor psum;   // F32 [E]
  int64_t rows = 0;
};
AuxStats aux_stats_zeros(int64_t experts, int device, cudaStream_t stream);

// logits F32|BF16 [T, E] on a CUDA device. When `stats` is given, this layer's statistics are added.
RouterResult router_forward(const Tensor& logits, int64_t top_k, bool norm_topk_prob, bool bf16, AuxStats* stats,
                            cudaStream_t stream);

// GPT-OSS's router (GptOssTopKRouter after its biased linear; the CPU twin is cpu::router_topk_softmax_forward):
// top-k of the logits themselves (ties to the lower index, NaN first, as above), then the softmax over those k
// values (fp32 math as the CPU; bf16 mode rounds the weights, HF's bf16 softmax). `stats` gets the same statistics
// as router_forward's: HF's aux loss reads the FULL softmax of these (biased) logits and its own top-k of it.
RouterResult router_topk_softmax_forward(const Tensor& logits, int64_t top_k, bool bf16, AuxStats* stats,
                                         cudaStream_t stream);

// From the summed statistics: aux (F32 [1]) = E · Σ_e f_e · P_e with f_e = count/rows, P_e = psum/rows
// (bf16 mode: P_e rounded to bf16), and aux_dp (F32 [E]) = daux · E · f_e / rows, the gradient of the
// aux loss w.r.t. each probability that router_backward spreads through every layer's softmax.
// Both outputs are allocated here; zero rows give aux = 0 and aux_dp = 0.
void aux_loss_finish(const AuxStats& stats, bool bf16, double daux, Tensor& aux, Tensor& aux_dp, cudaStream_t stream);

// dweights F32 [T, k] = d(loss)/d(routing weights) -> dlogits [T, E] (F32 or BF16, allocated by the
// caller), through the renormalisation, the top-k gather and the softmax; plus, when aux_dp is defined,
// the aux-loss path through the (bf16 mode: rounded) probabilities. Overwrites dlogits.
void router_backward(const Tensor& dweights, const Tensor& logits, const RouterResult& r, bool norm_topk_prob,
                     const Tensor& aux_dp, bool bf16, Tensor& dlogits, cudaStream_t stream);

// GPT-OSS's backward: dlogits [T, E] (F32|BF16, overwritten) = the k-way softmax's gradient on the selected
// experts, v_s·(dw_s − Σ_j dw_j·v_j) with v recomputed from the logits (zero elsewhere), plus, when aux_dp is
// defined, the aux-loss path through the full softmax exactly as router_backward adds it.
void router_topk_softmax_backward(const Tensor& dweights, const Tensor& logits, const RouterResult& r,
                                  const Tensor& aux_dp, bool bf16, Tensor& dlogits, cudaStream_t stream);

// A benchmark probe (`mixtune bench --balanced-router`; off by default, never set by training): after the
// router, every token's k experts become (t·k + j) mod E, so each expert gets exactly T·k/E rows (when E divides
// T·k), as a perfectly balanced router would give. The weights stay the real router's, so the model trains on
// nonsense routes: it exists to measure what the real router's uneven loads cost the expert kernels.
void set_balanced_routing_probe(bool on);
bool balanced_routing_probe();
// Overwrites r.index [T, k] with those routes (I32 on a CUDA device; k <= E).
void router_force_balanced(RouterResult& r, int64_t experts, cudaStream_t stream);

// A fault-injection probe for tests only (tests/models/cuda/gpu_vs_transformers_test.cpp; off by default, never
// set by training or the bench): every `every`-th token (t % every == 0) has its k-th selected expert replaced by
// the best expert it did not select, the (k+1)-th — the off-by-one a top-k bug gives — so a test can show that its
// comparison with Transformers catches a partial routing error. 0 turns it off.
void set_routing_fault_probe(int every);
int routing_fault_probe();
// Applies it to r.index [T, k] from the router logits [T, E] (BF16 or F32, on the same device).
void router_inject_fault(RouterResult& r, const Tensor& logits, int every, cudaStream_t stream);

}  // namespace mt::cuda
