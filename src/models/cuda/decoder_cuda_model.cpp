#include "models/cuda/decoder_cuda_model.h"

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/flash_attention_dims.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/linear_cross_entropy.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/row_select.h"
#include "layers/cuda/attention_block_cuda.h"
#include "layers/cuda/mlp_block_cuda.h"
#include "layers/cuda/moe_block_cuda.h"
#include "models/decoder_model.h"

namespace mt {

namespace {

using cuda::Phase;

// One decoder layer's saved state. x_in is the layer input (residual stream), x_mid the stream after
// the attention residual add (the MoE or dense MLP block's input).
struct LayerActs {
  Tensor x_in, x_mid;
  AttentionActsCuda attn;
  MoeActsCuda moe;
  MlpActsCuda mlp;  // a dense layer's
};

// ---- Dense MLP layers (mlp_only_layers, decoder_sparse_step, a dense Qwen3): the shared MLP block ----
bool dense_layer(const CudaBlockEnv& env) { return !env.cfg->is_moe_layer(env.layer); }
MlpDimsCuda dense_spec(const DecoderSpec& c, int64_t layer) {
  const MlpSpec& m = *c.mlp_of(layer);
  return {c.hidden_size, m.intermediate_size, m.activation};
}
MlpWeightsCuda dense_weights(const LayerWeights& L) { return {L.mlp_gate, L.mlp_up, L.mlp_down}; }
MlpGradsCuda dense_grads(LayerWeights& G) { return {G.mlp_gate, G.mlp_up, G.mlp_down}; }
// ---- end of the dense MLP layers' helpers ----

// Runs layer l (env.layer) from its input stream x and normalised input a; fills acts and returns the MoE
// or dense MLP output (before its residual add, which the next norm fuses).
Tensor layer_forward(const CudaBlockEnv& env, const LayerWeights& L, const Tensor& x, const Tensor& a,
                     cuda::AuxStats* stats, LayerActs& acts) {
  acts.x_in = x;
  Tensor y = attention_block_forward_cuda(env, L, a, acts.attn);
  env.phase(Phase::other);
  acts.x_mid = env.bf16(x.shape());
  Tensor n = env.bf16(x.shape());
  cuda::rmsnorm_residual_forward(y, x, L.post_norm, env.eps(), acts.x_mid, n, nullptr, env.stream);
  if (dense_layer(env))
    return mlp_block_forward_cuda(env, dense_spec(*env.cfg, env.layer), dense_weights(L), n, acts.mlp);
  return moe_block_forward_cuda(env, L, n, stats, acts.moe);
}

void layer_release(LayerActs& acts, Recompute r) {
  if (r == Recompute::none) return;
  if (r == Recompute::selective) {
    attention_acts_drop_cheap(acts.attn);
    moe_acts_drop_cheap(acts.moe);
    mlp_acts_drop_cheap(acts.mlp);
    return;
  }
  Tensor x = acts.x_in;
  acts = {};
  acts.x_in = x;
}

// Makes every tensor the backward needs present again.
void layer_restore(const CudaBlockEnv& env, const LayerWeights& L, LayerActs& acts, Recompute r) {
  if (r == Recompute::none) return;
  if (r == Recompute::full) {
    env.phase(Phase::other);
    Tensor a = env.bf16(acts.x_in.shape());
    cuda::rmsnorm_forward(acts.x_in, L.input_norm, env.eps(), a, nullptr, env.stream);
    layer_forward(env, L, acts.x_in, a, nullptr, acts);  // same routing: every kernel is deterministic
    return;
  }
  attention_acts_restore(env, L, acts.x_in, acts.attn);
  if (!dense_layer(env)) {
    moe_acts_restore(env, L, acts.x_mid, acts.moe);
    return;
  }
  if (!acts.mlp.n.defined()) {
    env.phase(Phase::other);
    acts.mlp.n = env.bf16(acts.x_mid.shape());
    cuda::rmsnorm_forward(acts.x_mid, L.post_norm, env.eps(), acts.mlp.n, nullptr, env.stream);
  }
  mlp_acts_restore(env, dense_spec(*env.cfg, env.layer), acts.mlp);
}

// The model's calls into a ParamResidency (ZeRO-3); no-ops without one.
struct Params {
  ParamResidency* r = nullptr;
  void fetch(int64_t g) const {
    if (r) r->fetch(g);
  }
  void prefetch(int64_t g) const {
    if (r) r->prefetch(g);
  }
  void release(int64_t g, bool backward_follows) const {
    if (r) r->release(g, backward_follows);
  }
};

// Embedding, every decoder layer and the final norm. keep: each layer's saved tensors (released per
// `rc`), or null (forward only: dropped as soon as the next layer has its input).
struct StreamEnd {
  Tensor x;   // residual stream after the last layer (the final norm's input)
  Tensor xf;  // final-norm output
};
// Under ZeRO-3 the groups are fetched in reading order, each next one prefetched while the current one
// computes; the end of layer l reads layer l + 1's input norm, so both are here there. The head's group
// stays fetched (the caller releases it).
StreamEnd run_layers(const CudaBlockEnv& env, const ModelWeights& w, const CudaBatch& b, cuda::AuxStats* stats,
                     std::vector<LayerActs>* keep, Recompute rc, const Params& params) {
  const DecoderSpec& c = *env.cfg;
  const int64_t T = b.tokens(), H = c.hidden_size, nl = c.num_layers();
  const int64_t head = ParamResidency::head(nl);
  env.phase(Phase::other);
  params.fetch(ParamResidency::kEmbedding);
  params.prefetch(0);
  Tensor x = env.bf16({T, H});
  cuda::embedding_forward(b.ids, w.embed, x, env.stream);
  params.fetch(0);  // the first input norm (the head's final norm without layers)
  params.release(ParamResidency::kEmbedding, false);  // the embedding backward reads no parameter
  Tensor a = env.bf16({T, H});
  cuda::rmsnorm_forward(x, nl > 0 ? w.layers[0].input_norm : w.final_norm, env.eps(), a, nullptr, env.stream);
  for (int64_t l = 0; l < nl; ++l) {
    LayerActs local;
    LayerActs& acts = keep ? (*keep)[l] : local;
    CudaBlockEnv lenv = env;
    lenv.layer = l;
    params.prefetch(l + 1);
    Tensor y = layer_forward(lenv, w.layers[l], x, a, stats, acts);
    env.phase(Phase::other);
    params.fetch(l + 1);
    const Tensor& next_norm = l + 1 < nl ? w.layers[l + 1].input_norm : w.final_norm;
    x = env.bf16({T, H});
    a = env.bf16({T, H});
    cuda::rmsnorm_residual_forward(y, acts.x_mid, next_norm, env.eps(), x, a, nullptr, env.stream);
    if (keep) layer_release(acts, rc);
    params.release(l, keep != nullptr);
  }
  params.fetch(head);
  return {x, a};
}

// Gradients: shaped like the parameters, on the device, F32 (the stacked expert weights may be BF16).
void check_grads(const ModelWeights& w, const ModelWeights& g, int device) {
  auto wp = w.named_parameters();
  auto gp = g.named_parameters();
  MT_CHECK(wp.size() == gp.size() && g.layers.size() == w.layers.size(), "gradients: {} tensors for {} parameters",
           gp.size(), wp.size());
  for (size_t i = 0; i < wp.size(); ++i) {
    const Tensor& t = *gp[i].second;
    const bool expert = w.param_table().is_expert_stack(gp[i].first);
    MT_CHECK(t.defined() && t.device() == Device::cuda(device) && t.shape() == wp[i].second->shape() &&
                 (t.dtype() == DType::F32 || (expert && t.dtype() == DType::BF16)),
             "gradient {}: expected F32{} {} on cuda:{}, found {}", gp[i].first, expert ? " or BF16" : "",
             shape_str(wp[i].second->shape()), device, t.defined() ? t.desc() + " on " + t.device().str() : "none");
  }
}

bool config_adds_aux(const DecoderSpec& c) {
  return c.aux_loss_on() && c.has_moe();  // the aux loss averages over the MoE layers' router logits
}

// The LM head and the loss over the rows that have a target (every row when b.target_rows is undefined):
// ignored rows (prompt tokens of answer-only chat data, padding, each row's last token) add nothing to the
// loss or to any gradient, so their logits are never computed, as in the CPU head (layers/lm_head.cpp).
// dxf (with dhead, or both null): d(loss)/d(xf) for every row, zero where there is no target.
void head_loss(const CudaBlockEnv& env, const Tensor& xf, const Tensor& head, const CudaBatch& b,
               const cuda::LinearCrossEntropyArgs& args, CudaLoss& loss, Tensor* dxf, Tensor* dhead) {
  if (!b.target_rows.defined()) {
    cuda::linear_cross_entropy(xf, head, b.targets, args, loss.ce_sum, loss.count, dxf, dhead, env.stream);
    return;
  }
  const int64_t R = b.target_rows.dim(0), H = xf.dim(1);
  if (R == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(loss.ce_sum.data(), 0, loss.ce_sum.nbytes(), env.stream));
    MT_CUDA_CHECK(cudaMemsetAsync(loss.count.data(), 0, loss.count.nbytes(), env.stream));
    if (dxf) MT_CUDA_CHECK(cudaMemsetAsync(dxf->data(), 0, dxf->nbytes(), env.stream));
    return;
  }
  Tensor xr = Tensor::empty({R, H}, xf.dtype(), xf.device());
  cuda::rows_gather(xf, b.target_rows, xr, env.stream);
  Tensor dxr = dxf ? Tensor::empty({R, H}, dxf->dtype(), dxf->device()) : Tensor();
  cuda::linear_cross_entropy(xr, head, b.row_targets, args, loss.ce_sum, loss.count, dxf ? &dxr : nullptr, dhead,
                             env.stream);
  if (dxf) cuda::rows_scatter(dxr, b.target_rows, *dxf, env.stream);
}

}  // namespace

std::string cuda_model_unsupported_reason(const DecoderSpec& c) {
  if (!cuda::flash_attention_head_dim_supported(c.only_attention().head_dim))
    return fmt::format("head_dim {} has no flash-attention kernel ({})", c.only_attention().head_dim,
                       cuda::flash_attention_head_dims());
  if (c.hidden_size % 8 != 0 || (c.has_moe() && c.only_moe().expert.intermediate_size % 8 != 0))
    return fmt::format("hidden_size {} and moe_intermediate_size {} must be multiples of 8 for the grouped GEMM",
                       c.hidden_size, c.has_moe() ? c.only_moe().expert.intermediate_size : 0);
  for (int64_t l = 0; l < c.num_layers(); ++l)  // the gate and up halves of the dense MLP's [T, 2F] buffer
    if (const MlpSpec* m = c.mlp_of(l); m && m->intermediate_size % 8 != 0)
      return fmt::format("intermediate_size {} must be a multiple of 8 for the dense MLP layers' GEMMs",
                         m->intermediate_size);
  return "";
}

DecoderCudaModel::DecoderCudaModel(const DecoderSpec& cfg, ModelWeights& weights, int device,
                                     const CudaModelOptions& options)
    : cfg_(cfg), w_(weights), device_(device), opts_(options) {
  model_config_check(cfg_);
  if (const std::string why = cuda_model_unsupported_reason(cfg_); !why.empty())
    fail("config: {} — train this model with train.device: cpu", why);
  weights_check(cfg_, w_, "parameter", DType::BF16, Device::cuda(device_), experts_held());
  aux_on_ = config_adds_aux(cfg_);
  MT_CHECK(opts_.loss_chunk_rows > 0, "loss_chunk_rows must be positive, found {}", opts_.loss_chunk_rows);
  wgrad_passes_.resize(cfg_.num_layers());
  wgrad_passes_.set_pairing(opts_.pair_expert_wgrad);
}

int64_t DecoderCudaModel::experts_held() const {
  return opts_.expert_parallel ? opts_.expert_parallel->experts_per_rank() : cfg_.num_experts();
}

void DecoderCudaModel::flush_expert_grads() {
  const cuda::DeviceContext& ctx = cuda::device_context(device_);
  timer_.mark(Phase::experts, ctx.stream);
  wgrad_passes_.flush(ctx.stream);
}

CudaLoss DecoderCudaModel::forward(const CudaBatch& b) {
  const cuda::DeviceContext& ctx = cuda::device_context(device_);
  CudaBlockEnv env{&cfg_, &b, device_, ctx.stream, &timer_, opts_.expert_parallel};
  env.ep_gather = b.uniform_across_ranks;
  env.deterministic = opts_.deterministic;
  cuda::AuxStats stats;
  if (aux_on_) stats = cuda::aux_stats_zeros(cfg_.num_experts(), device_, ctx.stream);

  const Params params{opts_.residency};
  const Tensor xf = run_layers(env, w_, b, aux_on_ ? &stats : nullptr, nullptr, Recompute::none, params).xf;
  CudaLoss loss;
  loss.ce_sum = Tensor::empty({1}, DType::F32, env.dev());
  loss.count = Tensor::empty({1}, DType::I32, env.dev());
  if (b.targets.defined()) {
    env.phase(Phase::head_loss);
    cuda::LinearCrossEntropyArgs args;
    args.chunk_rows = opts_.loss_chunk_rows;
    args.compute_grad = false;
    const Tensor& head = cfg_.tie_word_embeddings ? w_.embed : w_.lm_head;
    head_loss(env, xf, head, b, args, loss, nullptr, nullptr);
  } else {
    MT_CUDA_CHECK(cudaMemsetAsync(loss.ce_sum.data(), 0, 4, ctx.stream));
    MT_CUDA_CHECK(cudaMemsetAsync(loss.count.data(), 0, 4, ctx.stream));
  }
  params.release(ParamResidency::head(cfg_.num_layers()), false);
  if (aux_on_) {
    Tensor aux_dp;
    cuda::aux_loss_finish(stats, /*bf16=*/true, 0.0, loss.aux, aux_dp, ctx.stream);
  }
  env.phase(Phase::other);
  return loss;
}

DecoderCudaModel::Trace DecoderCudaModel::forward_trace(const CudaBatch& b) {
  const cuda::DeviceContext& ctx = cuda::device_context(device_);
  CudaBlockEnv env{&cfg_, &b, device_, ctx.stream, &timer_, opts_.expert_parallel};
  env.ep_gather = b.uniform_across_ranks;
  env.deterministic = opts_.deterministic;
  const Params params{opts_.residency};
  std::vector<LayerActs> acts(cfg_.num_layers());
  Trace t;
  t.final_hidden = run_layers(env, w_, b, nullptr, &acts, Recompute::none, params).xf;
  params.release(ParamResidency::head(cfg_.num_layers()), false);
  for (LayerActs& a : acts) t.routes.push_back(a.moe.route.index);  // undefined for a dense layer
  env.phase(Phase::other);
  return t;
}

CudaLoss DecoderCudaModel::forward_backward(const CudaBatch& b, ModelWeights& grads, double ce_divisor) {
  MT_CHECK(b.targets.defined(), "batch: forward_backward needs labels");
  MT_CHECK(ce_divisor > 0, "ce_divisor must be positive, found {}", ce_divisor);
  check_grads(w_, grads, device_);
  const cuda::DeviceContext& ctx = cuda::device_context(device_);
  CudaBlockEnv env{&cfg_, &b, device_, ctx.stream, &timer_, opts_.expert_parallel};
  env.ep_gather = b.uniform_across_ranks;
  env.deterministic = opts_.deterministic;
  const int64_t T = b.tokens(), H = cfg_.hidden_size, E = cfg_.num_experts(), nl = cfg_.num_layers();
  const Recompute rc = opts_.recompute;
  cuda::AuxStats stats;
  if (aux_on_) stats = cuda::aux_stats_zeros(E, device_, ctx.stream);

  // Forward, keeping what the recompute policy says.
  std::vector<LayerActs> acts(nl);
  const Params params{opts_.residency};
  StreamEnd end = run_layers(env, w_, b, aux_on_ ? &stats : nullptr, &acts, rc, params);
  Tensor x_last = end.x, xf = end.xf;
  end = {};

  // Loss and its gradient w.r.t. the final norm's output; then through the final norm.
  env.phase(Phase::head_loss);
  CudaLoss loss;
  loss.ce_sum = Tensor::empty({1}, DType::F32, env.dev());
  loss.count = Tensor::empty({1}, DType::I32, env.dev());
  cuda::LinearCrossEntropyArgs args;
  args.chunk_rows = opts_.loss_chunk_rows;
  args.grad_scale = static_cast<float>(1.0 / ce_divisor);
  const Tensor& head = cfg_.tie_word_embeddings ? w_.embed : w_.lm_head;
  Tensor& dhead = cfg_.tie_word_embeddings ? grads.embed : grads.lm_head;
  Tensor dxf = env.bf16({T, H});
  head_loss(env, xf, head, b, args, loss, &dxf, &dhead);
  xf = Tensor();
  env.phase(Phase::other);
  Tensor dx = env.bf16({T, H});
  cuda::rmsnorm_backward(dxf, x_last, w_.final_norm, env.eps(), dx, grads.final_norm, nullptr, ctx.stream);
  dxf = Tensor();
  x_last = Tensor();
  params.release(ParamResidency::head(nl), false);

  Tensor aux_dp;
  if (aux_on_) cuda::aux_loss_finish(stats, /*bf16=*/true, cfg_.aux_loss_coef(), loss.aux, aux_dp, ctx.stream);

  // Backward, layer by layer. dx is the gradient of the residual stream after layer l.
  // all_gather expert parallelism: each MoE backward starts with an all-gather of dx. dx is ready before
  // the layer above finishes its attention backward (the q/k/v weight gradients do not feed it), so the
  // all-gather starts on the side stream there and those GEMMs run under it.
  const bool prefetch_dout = env.ep && env.ep->mode() == EpDispatchMode::all_gather && env.ep_gather;
  EpPending dout_all;
  for (int64_t l = nl - 1; l >= 0; --l) {
    params.fetch(l);
    if (l > 0) params.prefetch(l - 1);
    const auto& L = w_.layers[l];
    auto& G = grads.layers[l];
    LayerActs& A = acts[l];
    CudaBlockEnv lenv = env;
    lenv.layer = l;
    if (rc == Recompute::full && dout_all.pending) ep_join(*env.ep, dout_all, ctx.stream);  // the recompute gathers too
    layer_restore(lenv, L, A, rc);
    Tensor dn = dense_layer(lenv)
                    ? mlp_block_backward_cuda(lenv, dense_spec(cfg_, l), dense_weights(L), A.mlp, dx, dense_grads(G))
                    : moe_block_backward_cuda(lenv, L, A.moe, dx, aux_dp, G, wgrad_passes_, l, &dout_all);
    MT_CHECK(!dout_all.pending, "layer {}: the prefetched output-gradient all-gather was not used", l);
    env.phase(Phase::other);
    Tensor dx_mid = env.bf16({T, H});
    cuda::rmsnorm_backward(dn, A.x_mid, L.post_norm, env.eps(), dx_mid, G.post_norm, &dx, ctx.stream);
    dn = Tensor();
    dx = Tensor();
    A.moe = {};
    A.mlp = {};
    const bool prefetch = prefetch_dout && l > 0 && cfg_.is_moe_layer(l - 1);  // a dense layer gathers nothing
    AttentionWgradsCuda wgrads;
    Tensor da = attention_block_backward_cuda(env, L, A.attn, dx_mid, G, prefetch ? &wgrads : nullptr);
    env.phase(Phase::other);
    dx = env.bf16({T, H});
    cuda::rmsnorm_backward(da, A.x_in, L.input_norm, env.eps(), dx, G.input_norm, &dx_mid, ctx.stream);
    if (prefetch) {
      env.phase(Phase::comm);
      dout_all = ep_all_gather_async(*env.ep, {dx}, ctx.stream,
                                     "layer " + std::to_string(l - 1) + ": all_gather(output gradient, backward)");
      attention_block_wgrads_cuda(env, wgrads, G);
    }
    A = {};
    params.release(l, false);
  }
  cuda::embedding_backward(b.ids, dx, grads.embed, ctx.stream);
  return loss;
}

}  // namespace mt
