#include "layers/cuda/moe_block_cuda.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/ep_row_watch.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/lora.h"
#include "kernels/cuda/relu2.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router_sigmoid_group.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/swiglu_oai.h"

namespace mt {

namespace {

std::string ep_what(const CudaBlockEnv& env, const char* op) {
  return "layer " + std::to_string(env.layer) + ": " + op;
}

bool ep_gathers(const CudaBlockEnv& env) {
  return env.ep && env.ep->mode() == EpDispatchMode::all_gather && env.ep_gather;
}

// The width of the experts' first GEMM: the packed gate | up rows (2I) of a gated activation, or up alone (I) for
// ReLU² (experts_gate_up is [E, I, H] then: model_weights.h).
int64_t first_gemm_width(const MoeSpec& spec) {
  const int64_t I = spec.expert.intermediate_size;
  return spec.expert.activation == Activation::relu2 ? I : 2 * I;
}

// The experts' activation on the first GEMM's rows: SwiGLU (Qwen3-MoE, DeepSeek-V3), the clamped form (GPT-OSS), or
// ReLU² on up alone (Nemotron-H).
void activation_forward(const MoeSpec& spec, const Tensor& gu, Tensor& h, cudaStream_t stream) {
  if (spec.expert.activation == Activation::swiglu_oai)
    cuda::swiglu_oai_forward(gu, nullptr, h, stream);
  else if (spec.expert.activation == Activation::relu2)
    cuda::relu2_forward(gu, h, stream);
  else
    cuda::swiglu_forward(gu, nullptr, h, stream);
}
void activation_backward(const MoeSpec& spec, const Tensor& dh, const Tensor& gu, Tensor& dgu, cudaStream_t stream) {
  if (spec.expert.activation == Activation::swiglu_oai)
    cuda::swiglu_oai_backward(dh, gu, nullptr, dgu, nullptr, stream);
  else if (spec.expert.activation == Activation::relu2)
    cuda::relu2_backward(dh, gu, dgu, stream);
  else
    cuda::swiglu_backward(dh, gu, nullptr, dgu, nullptr, stream);
}

bool sigmoid_router(const MoeSpec& spec) { return spec.router.score == RouterScore::sigmoid_group; }

cuda::SigmoidGroupRouting sigmoid_routing(const MoeSpec& spec) {
  cuda::SigmoidGroupRouting r;
  r.top_k = spec.experts_per_token;
  r.groups = spec.router.groups;
  r.topk_groups = spec.router.topk_groups;
  r.norm_topk_prob = spec.router.norm_topk_prob;
  r.scale = spec.router.scale;
  return r;
}

// Routing from the router logits: softmax over all experts then top-k (Qwen3-MoE), top-k of the logits then a
// softmax over those k (GPT-OSS), or DeepSeek-V3's sigmoid group-limited top-k with its correction bias.
cuda::RouterResult route(const MoeSpec& spec, const LayerWeights& w, const Tensor& logits, cuda::AuxStats* stats,
                         cudaStream_t stream) {
  if (sigmoid_router(spec)) {
    MT_CHECK(stats == nullptr, "the sigmoid group router has no load-balancing loss statistics");
    return cuda::router_sigmoid_group_forward(logits, spec.router.correction_bias ? w.router_score_bias : Tensor(),
                                              sigmoid_routing(spec), nullptr, stream);
  }
  if (spec.router.score == RouterScore::topk_softmax)
    return cuda::router_topk_softmax_forward(logits, spec.experts_per_token, /*bf16=*/true, stats, stream);
  return cuda::router_forward(logits, spec.experts_per_token, spec.router.norm_topk_prob, /*bf16=*/true, stats,
                              stream);
}

}  // namespace

MlpDimsCuda moe_shared_dims(const DecoderSpec& cfg, const MoeSpec& spec) {
  MT_CHECK(spec.shared_expert.has_value(), "MoE block: no shared expert");
  return {cfg.hidden_size, spec.shared_expert->intermediate_size, spec.shared_expert->activation};
}
MlpWeightsCuda moe_shared_weights(const LayerWeights& w) {
  return {w.shared_gate, w.shared_up, w.shared_down, WeightSlot::shared_gate, WeightSlot::shared_up,
          WeightSlot::shared_down};
}
MlpGradsCuda moe_shared_grads(LayerWeights& g) { return {g.shared_gate, g.shared_up, g.shared_down}; }

Tensor moe_block_forward_cuda(const CudaBlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& n,
                              cuda::AuxStats* stats, MoeActsCuda& acts) {
  const int64_t T = env.tokens(), H = env.cfg->hidden_size, E = spec.num_experts, K = spec.experts_per_token,
                I = spec.expert.intermediate_size;
  env.phase(cuda::Phase::dispatch);
  acts.n = n;
  // The sigmoid router's logits are fp32: the GEMM of the bf16 operands written as fp32, not rounded.
  acts.logits = sigmoid_router(spec) ? Tensor::empty({T, E}, DType::F32, env.dev()) : env.bf16({T, E});
  if (spec.router.linear_bias)
    cuda::linear_forward_bias(n, w.router, w.router_bias, acts.logits, env.stream);
  else
    cuda::linear_forward(n, w.router, acts.logits, env.stream);
  acts.route = route(spec, w, acts.logits, stats, env.stream);
  const bool round_product = !sigmoid_router(spec);  // fp32 routing weights: w · y stays fp32 (hf-numerics.md §5.3)
  if (cuda::balanced_routing_probe()) cuda::router_force_balanced(acts.route, E, env.stream);  // bench probe only
  if (const int every = cuda::routing_fault_probe())  // test probe only
    cuda::router_inject_fault(acts.route, acts.logits, every, env.stream);
  if (ep_gathers(env)) {
    // Every token of the group once; this rank's experts pick their slots from it (a local plan).
    const CudaExpertParallel& ep = *env.ep;
    env.phase(cuda::Phase::comm);
    std::vector<Tensor> all = ep_all_gather_rows(ep, {n, acts.route.index, acts.route.weights}, env.stream,
                                                 ep_what(env, "all_gather(tokens and routing, forward)"));
    acts.n_all = all[0], acts.w_all = all[2];
    env.phase(cuda::Phase::dispatch);
    acts.plan = cuda::moe_plan_local(all[1], E, ep.first_expert(), ep.experts_per_rank(), env.stream);
    // The rows of this rank's experts: within a budget, checked on the device, or counted on the host.
    const int64_t share = T * K, most = ep.ranks() * T * std::min(K, ep.experts_per_rank());
    int64_t rows = ep.budget_rows(share, most);
    cuda::ep_watch_live_rows(acts.plan, rows > 0 ? rows : most, share, EpRowBudget::kScale, ep.watch(), env.stream);
    if (rows == 0) {
      env.phase(cuda::Phase::comm_plan);
      rows = ep_padded_rows(ep_live_rows(ep, acts.plan.offsets, ep.experts_per_rank(), env.stream,
                                         ep_what(env, "row count of this rank's experts")));
      env.phase(cuda::Phase::dispatch);
    }
    acts.xg = env.bf16({rows, H});
    cuda::moe_gather_live(acts.n_all, acts.plan, acts.xg, env.stream);
    acts.expert_offsets = acts.plan.live_offsets();
  } else {
    acts.plan = cuda::moe_plan(acts.route.index, E, env.stream);
    acts.xg = cuda::moe_gather(n, acts.plan, env.stream);
    acts.expert_offsets = acts.plan.offsets;
    if (env.ep) {
      env.phase(cuda::Phase::comm_plan);
      acts.ep = ep_dispatch_plan(*env.ep, acts.plan.offsets, env.stream, ep_what(env, "expert dispatch plan"));
      env.phase(cuda::Phase::comm);
      acts.xg = ep_to_experts(*env.ep, acts.ep, acts.xg, env.stream,
                              ep_what(env, "all_to_allv(expert dispatch, forward)"));
      acts.expert_offsets = acts.ep.layout.local_offsets;
    }
  }
  const int64_t N = acts.xg.dim(0);

  env.phase(cuda::Phase::experts);
  acts.gu = env.bf16({N, first_gemm_width(spec)});
  cuda::grouped_gemm_forward(acts.xg, w.experts_gate_up, acts.expert_offsets, acts.gu, env.stream);
  // The adapters join each GEMM's output before its bias (PEFT adapts the weight; the bias stays as it is).
  if (const cuda::LoraOperands l = env.lora(WeightSlot::experts_gate_up); l.on())
    acts.u_gate_up = cuda::lora_grouped_forward(acts.xg, acts.expert_offsets, l, acts.gu, env.stream);
  if (spec.expert.bias) cuda::grouped_bias_add(acts.gu, w.experts_gate_up_bias, acts.expert_offsets, env.stream);
  acts.h = env.bf16({N, I});
  activation_forward(spec, acts.gu, acts.h, env.stream);
  acts.yd = env.bf16({N, H});
  cuda::grouped_gemm_forward(acts.h, w.experts_down, acts.expert_offsets, acts.yd, env.stream);
  if (const cuda::LoraOperands l = env.lora(WeightSlot::experts_down); l.on())
    acts.u_down = cuda::lora_grouped_forward(acts.h, acts.expert_offsets, l, acts.yd, env.stream);
  if (spec.expert.bias) cuda::grouped_bias_add(acts.yd, w.experts_down_bias, acts.expert_offsets, env.stream);
  Tensor out;
  if (ep_gathers(env)) {
    env.phase(cuda::Phase::dispatch);
    Tensor partial = env.bf16({acts.n_all.dim(0), H});
    cuda::moe_combine(acts.yd, acts.w_all, acts.plan, partial, env.stream, round_product);
    env.phase(cuda::Phase::comm);
    out = ep_reduce_scatter_rows(*env.ep, partial, env.stream, ep_what(env, "reduce_scatter(expert combine, forward)"));
  } else {
    if (env.ep) {
      env.phase(cuda::Phase::comm);
      acts.yd = ep_from_experts(*env.ep, acts.ep, acts.yd, T * K, env.stream,
                                ep_what(env, "all_to_allv(expert combine, forward)"));
    }
    env.phase(cuda::Phase::dispatch);
    out = env.bf16({T, H});
    cuda::moe_combine(acts.yd, acts.route.weights, acts.plan, out, env.stream, round_product);
  }
  if (spec.shared_expert) {
    // DeepseekV3MoE: experts(...) + shared_experts(n), the bf16 add of two bf16 tensors.
    // NOTE: run after the routed experts on the same stream; overlapping it with them (a second stream) is left for
    // later.
    const Tensor shared = mlp_block_forward_cuda(env, moe_shared_dims(*env.cfg, spec), moe_shared_weights(w), n,
                                                 acts.shared);
    cuda::lora_add_rows(out, shared, 1.0f, nullptr, env.stream);
  }
  return out;
}

void moe_acts_drop_cheap(MoeActsCuda& acts) {
  acts.n = Tensor();
  if (!acts.ep.active()) acts.xg = Tensor();
  acts.h = Tensor();
  mlp_acts_drop_cheap(acts.shared);
}

void moe_acts_restore(const CudaBlockEnv& env, const MoeSpec& spec, const LayerWeights& w, const Tensor& x,
                      MoeActsCuda& acts) {
  const int64_t T = env.tokens(), H = env.cfg->hidden_size, I = spec.expert.intermediate_size;
  env.phase(cuda::Phase::other);
  if (!acts.n.defined()) {
    acts.n = env.bf16({T, H});
    cuda::rmsnorm_forward(x, w.post_norm, env.eps(), acts.n, nullptr, env.stream, env.norm_round_once());
  }
  env.phase(cuda::Phase::dispatch);
  if (!acts.xg.defined() && acts.n_all.defined()) {
    acts.xg = env.bf16({acts.gu.dim(0), H});  // the forward's rows
    cuda::moe_gather_live(acts.n_all, acts.plan, acts.xg, env.stream);
  } else if (!acts.xg.defined()) {
    acts.xg = cuda::moe_gather(acts.n, acts.plan, env.stream);
  }
  env.phase(cuda::Phase::experts);
  if (!acts.h.defined()) {
    acts.h = env.bf16({acts.gu.dim(0), I});
    activation_forward(spec, acts.gu, acts.h, env.stream);
  }
  if (spec.shared_expert) {
    acts.shared.n = acts.n;
    mlp_acts_restore(env, moe_shared_dims(*env.cfg, spec), acts.shared);
  }
}

Tensor moe_block_backward_cuda(const CudaBlockEnv& env, const MoeSpec& spec, const LayerWeights& w,
                               const MoeActsCuda& acts, const Tensor& dout, const Tensor& aux_dp, LayerWeights& g,
                               ExpertWgradPasses& passes, int64_t layer, EpPending* prefetched) {
  auto wgrad = [&](ExpertWgradPasses::Which which, const Tensor& dy, const Tensor& x, Tensor& dw) {
    if (dw.defined()) passes.add(layer, which, dy, x, acts.expert_offsets, dw, env.stream);  // else frozen
  };
  auto adapter_backward = [&](int slot, const Tensor& dy, const Tensor& x, const Tensor& u, Tensor& dx) {
    if (const cuda::LoraOperands l = env.lora(slot); l.on())
      cuda::lora_grouped_backward(dy, x, u, acts.expert_offsets, l, dx, env.dlora(slot), env.stream);
  };
  const int64_t T = env.tokens(), H = env.cfg->hidden_size, E = spec.num_experts, K = spec.experts_per_token,
                I = spec.expert.intermediate_size;
  const int64_t N = acts.xg.dim(0);
  const bool gathers = acts.n_all.defined();
  Tensor dyd, dweights;
  if (gathers) {
    // The group's output gradients once per rank; this rank's slots of them.
    env.phase(cuda::Phase::comm);
    Tensor dout_all;
    if (prefetched && prefetched->pending) {
      ep_join(*env.ep, *prefetched, env.stream);
      dout_all = prefetched->results[0];
      *prefetched = {};
    } else {
      dout_all = ep_all_gather_rows(*env.ep, {dout}, env.stream,
                                    ep_what(env, "all_gather(output gradient, backward)"))[0];
    }
    env.phase(cuda::Phase::dispatch);
    dyd = env.bf16({N, H});
    dweights = Tensor::empty({dout_all.dim(0), K}, DType::F32, env.dev());
    cuda::moe_combine_backward(dout_all, acts.yd, acts.w_all, acts.plan, dyd, dweights, env.stream);
  } else {
    env.phase(cuda::Phase::dispatch);
    dyd = env.bf16({T * K, H});
    dweights = Tensor::empty({T, K}, DType::F32, env.dev());
    cuda::moe_combine_backward(dout, acts.yd, acts.route.weights, acts.plan, dyd, dweights, env.stream);
  }
  if (acts.ep.active()) {
    env.phase(cuda::Phase::comm);
    dyd = ep_to_experts(*env.ep, acts.ep, dyd, env.stream, ep_what(env, "all_to_allv(expert dispatch, backward)"));
  }

  env.phase(cuda::Phase::experts);
  Tensor dh = env.bf16({N, I});
  cuda::grouped_gemm_dgrad(dyd, w.experts_down, acts.expert_offsets, dh, env.stream);
  adapter_backward(WeightSlot::experts_down, dyd, acts.h, acts.u_down, dh);
  wgrad(ExpertWgradPasses::down, dyd, acts.h, g.experts_down);
  if (spec.expert.bias && g.experts_down_bias.defined())
    cuda::grouped_bias_backward(dyd, acts.expert_offsets, g.experts_down_bias, env.stream);
  dyd = Tensor();
  Tensor dgu = env.bf16({N, first_gemm_width(spec)});
  activation_backward(spec, dh, acts.gu, dgu, env.stream);
  if (spec.expert.bias && g.experts_gate_up_bias.defined())
    cuda::grouped_bias_backward(dgu, acts.expert_offsets, g.experts_gate_up_bias, env.stream);
  dh = Tensor();
  Tensor dxg = env.bf16({N, H});
  cuda::grouped_gemm_dgrad(dgu, w.experts_gate_up, acts.expert_offsets, dxg, env.stream);
  adapter_backward(WeightSlot::experts_gate_up, dgu, acts.xg, acts.u_gate_up, dxg);
  Tensor dn;
  if (gathers) {
    // The input gradients' partial sums go back to their ranks on the side stream, under the wgrad.
    env.phase(cuda::Phase::dispatch);
    Tensor dn_partial = env.bf16({acts.n_all.dim(0), H});
    cuda::moe_gather_backward(dxg, acts.plan, dn_partial, env.stream);
    dxg = Tensor();
    EpPending sums = ep_reduce_scatter_async(*env.ep, {dn_partial, dweights}, env.stream,
                                                 ep_what(env, "reduce_scatter(input gradient, backward)"));
    dn_partial = Tensor(), dweights = Tensor();
    env.phase(cuda::Phase::experts);
    wgrad(ExpertWgradPasses::gate_up, dgu, acts.xg, g.experts_gate_up);
    dgu = Tensor();
    env.phase(cuda::Phase::comm);
    ep_join(*env.ep, sums, env.stream);
    dn = sums.results[0], dweights = sums.results[1];
  } else {
    wgrad(ExpertWgradPasses::gate_up, dgu, acts.xg, g.experts_gate_up);
    dgu = Tensor();
  }
  if (acts.ep.active()) {
    env.phase(cuda::Phase::comm);
    dxg = ep_from_experts(*env.ep, acts.ep, dxg, T * K, env.stream,
                          ep_what(env, "all_to_allv(expert combine, backward)"));
  }

  env.phase(cuda::Phase::dispatch);
  if (!gathers) {
    dn = env.bf16({T, H});
    cuda::moe_gather_backward(dxg, acts.plan, dn, env.stream);
    dxg = Tensor();
  }
  Tensor dlogits = env.bf16({T, E});
  if (sigmoid_router(spec))  // no aux loss: aux_dp is undefined (the spec has none)
    cuda::router_sigmoid_group_backward(dweights, acts.logits, acts.route, sigmoid_routing(spec), dlogits, env.stream);
  else if (spec.router.score == RouterScore::topk_softmax)
    cuda::router_topk_softmax_backward(dweights, acts.logits, acts.route, aux_dp, /*bf16=*/true, dlogits, env.stream);
  else
    cuda::router_backward(dweights, acts.logits, acts.route, spec.router.norm_topk_prob, aux_dp, /*bf16=*/true,
                          dlogits, env.stream);
  if (spec.router.linear_bias && g.router_bias.defined()) cuda::bias_backward(dlogits, g.router_bias, env.stream);
  cuda::linear_backward_input(dlogits, w.router, dn, env.stream, 1.0f);
  if (g.router.defined()) cuda::linear_backward_weight(dlogits, acts.n, g.router, env.stream);
  if (spec.shared_expert)  // dout reaches it unchanged; its input gradient is added into dn
    mlp_block_backward_cuda(env, moe_shared_dims(*env.cfg, spec), moe_shared_weights(w), acts.shared, dout,
                            moe_shared_grads(g), &dn);
  return dn;
}

}  // namespace mt
