#include "models/cuda/decoder_cuda_model.h"

#include <fmt/format.h>

#include <cstdlib>

#include "core/error.h"
#include "kernels/cuda/flash_attention_dims.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/linear_cross_entropy.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/router_sigmoid_group.h"
#include "kernels/cuda/row_select.h"
#include "layers/cuda/attention_block_cuda.h"
#include "layers/cuda/mamba2_mixer_block_cuda.h"
#include "layers/cuda/mla_attention_block_cuda.h"
#include "layers/cuda/mlp_block_cuda.h"
#include "layers/cuda/moe_block_cuda.h"
#include "models/decoder_model.h"

namespace mt {

namespace {

using cuda::Phase;

// One sublayer's saved state: x its input (the residual stream) and the tensors its block keeps (those of its
// kind; the others stay empty).
struct SublayerActs {
  Tensor x;
  AttentionActsCuda attn;
  MlaActsCuda mla;
  MoeActsCuda moe;
  MlpActsCuda mlp;
  Mamba2ActsCuda mamba;
};

// One decoder layer's saved state: one SublayerActs per sublayer of its spec, in execution order.
struct LayerActs {
  std::vector<SublayerActs> subs;
};

const std::vector<Sublayer>& sublayers_of(const DecoderSpec& c, int64_t layer) {
  return c.layers[static_cast<size_t>(layer)].sublayers;
}
const AttentionSpec& attention_spec(const DecoderSpec& c, const Sublayer& s) {
  return c.attention[static_cast<size_t>(s.index)];
}
const MoeSpec& moe_spec(const DecoderSpec& c, const Sublayer& s) { return c.moe[static_cast<size_t>(s.index)]; }
const Mamba2Spec& mamba2_spec(const DecoderSpec& c, const Sublayer& s) { return c.mamba2[static_cast<size_t>(s.index)]; }
// An attention sublayer of multi-head latent attention (layers/cuda/mla_attention_block_cuda.h), not GQA.
bool is_mla(const DecoderSpec& c, const Sublayer& s) {
  return s.kind == SublayerKind::attention && attention_spec(c, s).kind == AttentionKind::mla;
}

// The norm before a sublayer, by the weights' slot rule (model_weights.h WeightSlot): input_norm before the
// attention and the Mamba2 mixer, post_norm before the MLP or MoE. Parameters and gradients alike.
template <typename Weights>
auto& norm_before(Weights& L, const Sublayer& s) {
  return s.kind == SublayerKind::attention || s.kind == SublayerKind::mamba2 ? L.input_norm : L.post_norm;
}

// The first norm of layer l, or the final norm after the last layer (the one the residual add of the layer
// before is fused into).
const Tensor& norm_entering(const DecoderSpec& c, const ModelWeights& w, int64_t l) {
  return l < c.num_layers() ? norm_before(w.layers[static_cast<size_t>(l)], sublayers_of(c, l).front())
                            : w.final_norm;
}

// The env of layer l: the model's env with the layer index and that layer's adapter (working copies, and in a
// backward its gradients).
CudaBlockEnv layer_env(const CudaBlockEnv& env, int64_t l, const LoraWeights* lora, LoraWeights* dlora) {
  CudaBlockEnv e = env;
  e.layer = l;
  e.lora_layer = lora ? &lora->layers[static_cast<size_t>(l)] : nullptr;
  e.dlora_layer = dlora ? &dlora->layers[static_cast<size_t>(l)] : nullptr;
  return e;
}

// A gradient to pass to a kernel that always adds one (the norms' dw comes out of the same fused pass as dx): the
// parameter's, or for a frozen one (undefined: LoRA) a scratch buffer whose sums are discarded.
Tensor& grad_or_scratch(Tensor& g, const Tensor& param, Tensor& scratch) {
  if (g.defined()) return g;
  scratch = Tensor::empty(param.shape(), DType::F32, param.device());
  return scratch;
}

// ---- The dense MLP sublayer: the shared MLP block, given its dims and weights ----
MlpDimsCuda mlp_dims(const DecoderSpec& c, const Sublayer& s) {
  const MlpSpec& m = c.mlp[static_cast<size_t>(s.index)];
  return {c.hidden_size, m.intermediate_size, m.activation};
}
MlpWeightsCuda mlp_weights(const LayerWeights& L) { return {L.mlp_gate, L.mlp_up, L.mlp_down}; }
MlpGradsCuda mlp_grads(LayerWeights& G) { return {G.mlp_gate, G.mlp_up, G.mlp_down}; }
// ---- end of the dense MLP sublayer's helpers ----

// Runs sublayer s of layer env.layer from its input stream x and normalised input a; fills acts and returns the
// block's output (before its residual add, which the next norm fuses).
Tensor sublayer_forward(const CudaBlockEnv& env, const Sublayer& s, const LayerWeights& L, const Tensor& x,
                        const Tensor& a, cuda::AuxStats* stats, SublayerActs& acts) {
  const DecoderSpec& c = *env.cfg;
  acts.x = x;
  switch (s.kind) {
    case SublayerKind::attention:
      if (is_mla(c, s)) return mla_attention_block_forward_cuda(env, attention_spec(c, s), L, a, acts.mla);
      return attention_block_forward_cuda(env, attention_spec(c, s), L, a, acts.attn);
    case SublayerKind::mlp: return mlp_block_forward_cuda(env, mlp_dims(c, s), mlp_weights(L), a, acts.mlp);
    case SublayerKind::moe: return moe_block_forward_cuda(env, moe_spec(c, s), L, a, stats, acts.moe);
    case SublayerKind::mamba2: return mamba2_block_forward_cuda(env, mamba2_spec(c, s), L, a, acts.mamba);
  }
  fail("layer {}: a {} sublayer has no CUDA block", env.layer, sublayer_kind_name(s.kind));
}

// Runs the sublayers of layer env.layer from its input stream x and the first sublayer's normalised input a,
// each sublayer's residual add fused into the next one's norm; fills acts and returns the last sublayer's output
// (its residual add is fused into the next layer's first norm, or the final norm, by the caller).
Tensor layer_forward(const CudaBlockEnv& env, const LayerWeights& L, Tensor x, Tensor a, cuda::AuxStats* stats,
                     LayerActs& acts) {
  const std::vector<Sublayer>& subs = sublayers_of(*env.cfg, env.layer);
  acts.subs.resize(subs.size());
  Tensor y;
  for (size_t i = 0; i < subs.size(); ++i) {
    if (i > 0) {
      env.phase(Phase::other);
      Tensor xi = env.bf16(x.shape()), ai = env.bf16(x.shape());
      cuda::rmsnorm_residual_forward(y, x, norm_before(L, subs[i]), env.eps(), xi, ai, nullptr, env.stream, env.norm_round_once());
      x = xi, a = ai;
    }
    y = sublayer_forward(env, subs[i], L, x, a, stats, acts.subs[i]);
  }
  return y;
}

void layer_release(LayerActs& acts, Recompute r) {
  if (r == Recompute::none) return;
  if (r == Recompute::selective) {
    for (SublayerActs& s : acts.subs) {
      attention_acts_drop_cheap(s.attn);
      mla_acts_drop_cheap(s.mla);
      moe_acts_drop_cheap(s.moe);
      mlp_acts_drop_cheap(s.mlp);
      mamba2_acts_drop_cheap(s.mamba);
    }
    return;
  }
  const Tensor x = acts.subs.front().x;  // full: the layer's input only
  for (SublayerActs& s : acts.subs) s = {};
  acts.subs.front().x = x;
}

// Recomputes what the selective policy dropped from sublayer s's block.
void sublayer_restore(const CudaBlockEnv& env, const Sublayer& s, const LayerWeights& L, SublayerActs& acts) {
  const DecoderSpec& c = *env.cfg;
  switch (s.kind) {
    case SublayerKind::attention:
      if (is_mla(c, s))
        mla_acts_restore(env, attention_spec(c, s), L, acts.x, acts.mla);
      else
        attention_acts_restore(env, attention_spec(c, s), L, acts.x, acts.attn);
      return;
    case SublayerKind::moe: moe_acts_restore(env, moe_spec(c, s), L, acts.x, acts.moe); return;
    case SublayerKind::mlp:
      if (!acts.mlp.n.defined()) {  // the norm before the block is the caller's
        env.phase(Phase::other);
        acts.mlp.n = env.bf16(acts.x.shape());
        cuda::rmsnorm_forward(acts.x, L.post_norm, env.eps(), acts.mlp.n, nullptr, env.stream, env.norm_round_once());
      }
      mlp_acts_restore(env, mlp_dims(c, s), acts.mlp);
      return;
    case SublayerKind::mamba2: mamba2_acts_restore(env, mamba2_spec(c, s), L, acts.x, acts.mamba); return;
  }
  fail("layer {}: a {} sublayer has no CUDA block", env.layer, sublayer_kind_name(s.kind));
}

// Makes every tensor the backward needs present again.
void layer_restore(const CudaBlockEnv& env, const LayerWeights& L, LayerActs& acts, Recompute r) {
  if (r == Recompute::none) return;
  const std::vector<Sublayer>& subs = sublayers_of(*env.cfg, env.layer);
  if (r == Recompute::full) {
    env.phase(Phase::other);
    const Tensor x = acts.subs.front().x;
    Tensor a = env.bf16(x.shape());
    cuda::rmsnorm_forward(x, norm_before(L, subs.front()), env.eps(), a, nullptr, env.stream, env.norm_round_once());
    layer_forward(env, L, x, a, nullptr, acts);  // same routing: every kernel is deterministic
    return;
  }
  for (size_t i = 0; i < subs.size(); ++i) sublayer_restore(env, subs[i], L, acts.subs[i]);
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
// computes; the end of layer l reads layer l + 1's first norm, so both are here there. The head's group
// stays fetched (the caller releases it).
// expert_load (CudaModelOptions::expert_load, or null): each MoE layer's routed slots are added there.
StreamEnd run_layers(const CudaBlockEnv& env, const ModelWeights& w, const CudaBatch& b, cuda::AuxStats* stats,
                     std::vector<LayerActs>* keep, Recompute rc, const Params& params, const LoraWeights* lora,
                     std::vector<Tensor>* expert_load = nullptr) {
  const DecoderSpec& c = *env.cfg;
  const int64_t T = b.tokens(), H = c.hidden_size, nl = c.num_layers();
  const int64_t head = ParamResidency::head(nl);
  env.phase(Phase::other);
  params.fetch(ParamResidency::kEmbedding);
  params.prefetch(0);
  Tensor x = env.bf16({T, H});
  cuda::embedding_forward(b.ids, w.embed, x, env.stream);
  params.fetch(0);  // layer 0's first norm (the head's final norm without layers)
  params.release(ParamResidency::kEmbedding, false);  // the embedding backward reads no parameter
  Tensor a = env.bf16({T, H});
  cuda::rmsnorm_forward(x, norm_entering(c, w, 0), env.eps(), a, nullptr, env.stream, env.norm_round_once());
  for (int64_t l = 0; l < nl; ++l) {
    LayerActs local;
    LayerActs& acts = keep ? (*keep)[l] : local;
    const CudaBlockEnv lenv = layer_env(env, l, lora, nullptr);
    params.prefetch(l + 1);
    Tensor y = layer_forward(lenv, w.layers[l], x, a, stats, acts);
    if (expert_load)  // the routed slots per expert: the MoE block's route.index, global expert ids [T, k]
      for (const SublayerActs& s : acts.subs)
        if (s.moe.route.index.defined())
          cuda::router_expert_load_add(s.moe.route.index, (*expert_load)[static_cast<size_t>(l)], env.stream);
    env.phase(Phase::other);
    params.fetch(l + 1);
    const Tensor x_last = acts.subs.back().x;  // the last sublayer's input
    x = env.bf16({T, H});
    a = env.bf16({T, H});
    cuda::rmsnorm_residual_forward(y, x_last, norm_entering(c, w, l + 1), env.eps(), x, a, nullptr, env.stream, env.norm_round_once());
    if (keep) layer_release(acts, rc);
    params.release(l, keep != nullptr);
  }
  params.fetch(head);
  return {x, a};
}

// Gradients: shaped like the parameters, on the device, F32 (the stacked expert weights may be BF16). frozen_allowed:
// an undefined one is a frozen parameter's (LoRA).
void check_grads(const ModelWeights& w, const ModelWeights& g, int device, bool frozen_allowed) {
  auto wp = w.named_parameters();
  auto gp = g.named_parameters();
  MT_CHECK(wp.size() == gp.size() && g.layers.size() == w.layers.size(), "gradients: {} tensors for {} parameters",
           gp.size(), wp.size());
  for (size_t i = 0; i < wp.size(); ++i) {
    const Tensor& t = *gp[i].second;
    if (frozen_allowed && !t.defined()) continue;
    const bool expert = w.param_table().is_expert_stack(gp[i].first);
    MT_CHECK(t.defined() && t.device() == Device::cuda(device) && t.shape() == wp[i].second->shape() &&
                 (t.dtype() == DType::F32 || (expert && t.dtype() == DType::BF16)),
             "gradient {}: expected F32{} {} on cuda:{}, found {}", gp[i].first, expert ? " or BF16" : "",
             shape_str(wp[i].second->shape()), device, t.defined() ? t.desc() + " on " + t.device().str() : "none");
  }
}

// A LoRA adapter (every adaptable slot has its CUDA block's path), its tensors on cuda:device: one per table entry,
// of its shape and dtype `dt`; an expert stack's r a multiple of 8 (the grouped GEMMs' rows).
void check_cuda_lora(const DecoderSpec& c, const LoraWeights& l, const char* what, DType dt, int device) {
  if (!l.table) fail("LoRA {}s without a table", what);
  if (static_cast<int64_t>(l.layers.size()) != c.num_layers())
    fail("LoRA {}s have {} layers, config num_hidden_layers is {}", what, l.layers.size(), c.num_layers());
  for (const LoraEntry& e : l.table->entries) {
    const Tensor& t = l.slot(e);
    if (!t.defined() || t.dtype() != dt || t.device() != Device::cuda(device) || t.shape() != e.shape)
      fail("LoRA {} {}: expected {}{} on cuda:{}, found {}", what, e.name, dtype_safetensors_name(dt),
           shape_str(e.shape), device, t.defined() ? t.desc() + " on " + t.device().str() : "none");
    if (e.role == ParamRole::expert_stack && l.table->config.r % 8 != 0)
      fail("peft.r: {} on expert stacks must be a multiple of 8 on the GPU (the grouped GEMMs' 16-byte rows); "
           "use 8, 16, 32, ...",
           l.table->config.r);
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
  // What the CPU engine runs and the CUDA kernels do not yet.
  // The configurations the layers run (a declared one no layer uses, such as Qwen3-MoE's mlp[0] without dense
  // layers, is not checked).
  for (int64_t l = 0; l < c.num_layers(); ++l)
    for (const Sublayer& s : sublayers_of(c, l)) {
      const size_t k = static_cast<size_t>(s.index);
      if (s.kind == SublayerKind::mamba2) {
        const Mamba2Spec& m = c.mamba2[k];
        if (m.head_dim > 64 || m.state > 128)  // kernels/cuda/ssd_scan.h's tiles
          return fmt::format("the Mamba2 scan's CUDA kernels take mamba_head_dim <= 64 and ssm_state_size <= 128 "
                             "(found {} and {})",
                             m.head_dim, m.state);
        if (m.in_proj_dim() % 8 != 0 || m.inner() % 8 != 0)
          return fmt::format("the Mamba2 mixer's in_proj width {} (d_inner {} + conv_dim {} + heads {}) and d_inner "
                             "must be multiples of 8 for the GEMMs",
                             m.in_proj_dim(), m.inner(), m.conv_dim(), m.heads);
      }
      if (s.kind == SublayerKind::attention) {
        const AttentionSpec& a = c.attention[k];
        // Any RoPE kind, none included (NoPE: Nemotron-H; GQA only, model_config_check refuses MLA without RoPE).
        const RopeSpec& r = a.rope;
        if (a.kind == AttentionKind::mla) {  // its own head sizes and RoPE columns (interleaved or split)
          if (const std::string why = mla_cuda_unsupported_reason(a); !why.empty())
            return "multi-head latent attention: " + why;
          if (c.hidden_size % 8 != 0 || a.q_lora_rank % 8 != 0 || a.kv_lora_rank % 8 != 0 ||
              (a.kv_lora_rank + a.qk_rope_head_dim) % 8 != 0 || (a.heads * a.head_dim) % 8 != 0 ||
              (a.heads * (a.qk_nope_head_dim + a.value_dim())) % 8 != 0 || (a.heads * a.value_dim()) % 8 != 0)
            return fmt::format("multi-head latent attention: q_lora_rank {}, kv_lora_rank {} (+ qk_rope_head_dim {}) "
                               "and the heads' widths must be multiples of 8 for the GEMMs",
                               a.q_lora_rank, a.kv_lora_rank, a.qk_rope_head_dim);
        } else {
          if (r.kind != RopeKind::none && (r.interleaved || r.rotary_dim != 0))
            return "grouped-query attention with interleaved or partial RoPE has no CUDA kernels yet";
          if (!cuda::flash_attention_head_dim_supported(a.head_dim))
            return fmt::format("head_dim {} has no flash-attention kernel ({})", a.head_dim,
                               cuda::flash_attention_head_dims());
        }
      }
      if (s.kind == SublayerKind::moe) {
        const MoeSpec& m = c.moe[k];
        // SwiGLU, GPT-OSS's clamped SwiGLU and ReLU² (up alone) have kernels: every Activation.
        if (m.router.score == RouterScore::sigmoid_group) {  // kernels/cuda/router_sigmoid_group.h's limits
          if (m.num_experts > 1024 || m.experts_per_token > 32)
            return fmt::format("the sigmoid group router's CUDA kernel takes up to 1024 experts and top-32 (found {} "
                               "experts, top-{})",
                               m.num_experts, m.experts_per_token);
          if (m.aux_loss_on) return "a load-balancing loss with the sigmoid group router has no CUDA kernel yet";
          if (m.router.linear_bias) return "a biased router linear with the sigmoid group router is not supported";
        } else if (m.router.correction_bias || m.router.scale != 1.0) {
          return "a softmax router with a correction bias or a routed scaling factor has no CUDA kernel yet";
        }
        if (m.shared_expert) {
          const MlpSpec& se = *m.shared_expert;
          if (se.bias || (se.activation != Activation::swiglu && se.activation != Activation::relu2))
            return "a shared expert with biases or an activation other than SwiGLU and ReLU² has no CUDA kernels yet";
          if (se.intermediate_size % 8 != 0)
            return fmt::format("the shared expert's intermediate size {} must be a multiple of 8 for its GEMMs",
                               se.intermediate_size);
        }
      }
      if (s.kind == SublayerKind::mlp &&
          (c.mlp[k].bias || (c.mlp[k].activation != Activation::swiglu && c.mlp[k].activation != Activation::relu2)))
        return "a dense MLP with biases or an activation other than SwiGLU and ReLU² has no CUDA kernels yet";
      if (s.kind == SublayerKind::moe && (c.hidden_size % 8 != 0 || c.moe[k].expert.intermediate_size % 8 != 0))
        return fmt::format("hidden_size {} and moe_intermediate_size {} must be multiples of 8 for the grouped GEMM",
                           c.hidden_size, c.moe[k].expert.intermediate_size);
      // the gate and up halves of the dense MLP's [T, 2F] buffer (ReLU²: up alone, [T, F])
      if (s.kind == SublayerKind::mlp && c.mlp[k].intermediate_size % 8 != 0)
        return fmt::format("intermediate_size {} must be a multiple of 8 for the dense MLP layers' GEMMs",
                           c.mlp[k].intermediate_size);
    }
  if (c.hidden_size % 8 != 0)
    return fmt::format("hidden_size {} must be a multiple of 8 for the GEMMs", c.hidden_size);
  return "";
}

DecoderCudaModel::DecoderCudaModel(const DecoderSpec& cfg, ModelWeights& weights, int device,
                                     const CudaModelOptions& options)
    : cfg_(cfg), w_(weights), device_(device), opts_(options) {
  model_config_check(cfg_);
  if (const std::string why = cuda_model_unsupported_reason(cfg_); !why.empty())
    fail("config: {} — train this model with train.device: cpu", why);
  weights_check(cfg_, w_, "parameter", DType::BF16, Device::cuda(device_), experts_held());
  if (opts_.lora) {
    if (opts_.expert_parallel || opts_.residency)
      fail("LoRA: expert parallelism and sharded parameters are not supported with an adapter");
    check_cuda_lora(cfg_, *opts_.lora, "working copy", DType::BF16, device_);
  }
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
  const Tensor xf =
      run_layers(env, w_, b, aux_on_ ? &stats : nullptr, nullptr, Recompute::none, params, opts_.lora).xf;
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
  t.final_hidden = run_layers(env, w_, b, nullptr, &acts, Recompute::none, params, opts_.lora).xf;
  params.release(ParamResidency::head(cfg_.num_layers()), false);
  for (int64_t l = 0; l < cfg_.num_layers(); ++l) {
    Tensor route;  // undefined for a layer without MoE
    const std::vector<Sublayer>& subs = sublayers_of(cfg_, l);
    for (size_t i = 0; i < subs.size(); ++i)
      if (subs[i].kind == SublayerKind::moe) route = acts[l].subs[i].moe.route.index;
    t.routes.push_back(route);
  }
  env.phase(Phase::other);
  return t;
}

CudaLoss DecoderCudaModel::forward_backward(const CudaBatch& b, ModelWeights& grads, double ce_divisor) {
  if (opts_.lora) fail("forward_backward: the model has a LoRA adapter; pass its gradient buffers");
  return forward_backward_impl(b, grads, nullptr, ce_divisor);
}

CudaLoss DecoderCudaModel::forward_backward(const CudaBatch& b, ModelWeights& grads, LoraWeights& lora_grads,
                                            double ce_divisor) {
  if (!opts_.lora) fail("forward_backward: LoRA gradient buffers given to a model without an adapter");
  check_cuda_lora(cfg_, lora_grads, "gradient", DType::F32, device_);
  if (lora_grads.table->entries.size() != opts_.lora->table->entries.size())
    fail("LoRA gradients have {} tensors, the adapter {}", lora_grads.table->entries.size(),
         opts_.lora->table->entries.size());
  return forward_backward_impl(b, grads, &lora_grads, ce_divisor);
}

CudaLoss DecoderCudaModel::forward_backward_impl(const CudaBatch& b, ModelWeights& grads, LoraWeights* lora_grads,
                                                 double ce_divisor) {
  MT_CHECK(b.targets.defined(), "batch: forward_backward needs labels");
  MT_CHECK(ce_divisor > 0, "ce_divisor must be positive, found {}", ce_divisor);
  check_grads(w_, grads, device_, lora_grads != nullptr);
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
  StreamEnd end = run_layers(env, w_, b, aux_on_ ? &stats : nullptr, &acts, rc, params, opts_.lora, opts_.expert_load);
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
  head_loss(env, xf, head, b, args, loss, &dxf, dhead.defined() ? &dhead : nullptr);  // undefined: frozen
  xf = Tensor();
  env.phase(Phase::other);
  Tensor dx = env.bf16({T, H});
  Tensor scratch;
  cuda::rmsnorm_backward(dxf, x_last, w_.final_norm, env.eps(), dx, grad_or_scratch(grads.final_norm, w_.final_norm, scratch),
                         nullptr, ctx.stream);
  dxf = Tensor();
  x_last = Tensor();
  params.release(ParamResidency::head(nl), false);

  Tensor aux_dp;
  if (aux_on_) cuda::aux_loss_finish(stats, /*bf16=*/true, cfg_.aux_loss_coef(), loss.aux, aux_dp, ctx.stream);

  // Backward, layer by layer, each layer's sublayers in reverse. dx is the gradient of the residual stream after
  // the sublayer whose backward runs. all_gather expert parallelism: each MoE backward starts with an all-gather
  // of its output gradient, which is ready as soon as the norm backward of the sublayer after it (in forward
  // order) has run; when that sublayer is an attention one, its q/k/v weight gradients do not feed the gradient,
  // so the all-gather starts on the side stream before them and those GEMMs run under it.
  const bool prefetch_dout = env.ep && env.ep->mode() == EpDispatchMode::all_gather && env.ep_gather;
  EpPending dout_all;
  for (int64_t l = nl - 1; l >= 0; --l) {
    params.fetch(l);
    if (l > 0) params.prefetch(l - 1);
    const auto& L = w_.layers[l];
    auto& G = grads.layers[l];
    LayerActs& A = acts[l];
    const CudaBlockEnv lenv = layer_env(env, l, opts_.lora, lora_grads);
    const std::vector<Sublayer>& subs = sublayers_of(cfg_, l);
    if (rc == Recompute::full && dout_all.pending) ep_join(*env.ep, dout_all, ctx.stream);  // the recompute gathers too
    layer_restore(lenv, L, A, rc);
    for (size_t i = subs.size(); i-- > 0;) {
      const Sublayer& s = subs[i];
      SublayerActs& S = A.subs[i];
      // The sublayer whose backward runs next (the one before in forward order) reads the gradient this one makes.
      const int64_t next_layer = i > 0 ? l : l - 1;
      const bool prefetch = prefetch_dout && next_layer >= 0 &&
                            (i > 0 ? subs[i - 1] : sublayers_of(cfg_, next_layer).back()).kind == SublayerKind::moe;
      AttentionWgradsCuda wgrads;
      Tensor dn;
      switch (s.kind) {
        case SublayerKind::attention:
          // MLA defers no weight gradient (wgrads stays empty: its call below does nothing).
          if (is_mla(cfg_, s))
            dn = mla_attention_block_backward_cuda(lenv, attention_spec(cfg_, s), L, S.mla, dx, G);
          else
            dn = attention_block_backward_cuda(lenv, attention_spec(cfg_, s), L, S.attn, dx, G,
                                               prefetch ? &wgrads : nullptr);
          break;
        case SublayerKind::mlp:
          dn = mlp_block_backward_cuda(lenv, mlp_dims(cfg_, s), mlp_weights(L), S.mlp, dx, mlp_grads(G));
          break;
        case SublayerKind::moe:
          dn = moe_block_backward_cuda(lenv, moe_spec(cfg_, s), L, S.moe, dx, aux_dp, G, wgrad_passes_, l, &dout_all);
          MT_CHECK(!dout_all.pending, "layer {}: the prefetched output-gradient all-gather was not used", l);
          break;
        case SublayerKind::mamba2:
          dn = mamba2_block_backward_cuda(lenv, mamba2_spec(cfg_, s), L, S.mamba, dx, G);
          break;
      }
      env.phase(Phase::other);
      Tensor dx_in = env.bf16({T, H});  // the gradient of the sublayer's input: its norm's plus the residual's
      cuda::rmsnorm_backward(dn, S.x, norm_before(L, s), env.eps(), dx_in,
                             grad_or_scratch(norm_before(G, s), norm_before(L, s), scratch), &dx, ctx.stream);
      dn = Tensor();
      dx = dx_in;
      dx_in = Tensor();
      S.moe = {};  // freed before the all-gather's buffers; the attention's input stays for its weight gradients
      S.mlp = {};
      S.mamba = {};
      if (prefetch) {
        env.phase(Phase::comm);
        const std::string what = "layer " + std::to_string(next_layer) + ": all_gather(output gradient, backward)";
        dout_all = ep_all_gather_async(*env.ep, {dx}, ctx.stream, what);
        if (s.kind == SublayerKind::attention) attention_block_wgrads_cuda(lenv, wgrads, G);
      }
      S = {};
    }
    A = {};
    params.release(l, false);
  }
  // The pad row: no gradient. A frozen embedding (LoRA): none at all.
  if (grads.embed.defined()) cuda::embedding_backward(b.ids, dx, grads.embed, cfg_.padding_idx, ctx.stream);
  return loss;
}

}  // namespace mt
