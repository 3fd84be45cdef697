#include "models/decoder_model.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/aux_loss.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/router_sigmoid_group.h"
#include "layers/attention_block.h"
#include "layers/block_env.h"
#include "layers/expert_parallel.h"
#include "layers/lm_head.h"
#include "layers/mamba2_mixer_block.h"
#include "layers/mla_attention_block.h"
#include "layers/mlp_block.h"
#include "layers/moe_block.h"
#include "models/lora_adapter.h"
#include "models/param_residency.h"
#include "models/registry.h"

namespace mt {

void weights_check(const DecoderSpec& c, const ModelWeights& w, const char* what, DType dtype, Device device,
                   int64_t experts_held, bool frozen_allowed) {
  if (static_cast<int64_t>(w.layers.size()) != c.num_layers())
    fail("{}s have {} layers, config num_hidden_layers is {}", what, w.layers.size(), c.num_layers());
  // Against the config's own table: `w` may have been made for another config.
  const ParamTable table = param_table_of(c);
  for (const ParamEntry& e : table.entries()) {
    const Tensor& t = w.slot(e);
    const Shape shape = param_shape_held(e, experts_held);
    const DType dt = param_dtype(e, dtype);
    if (!t.defined() && frozen_allowed) continue;  // a frozen parameter's gradient
    if (!t.defined()) fail("{} {} is missing", what, e.name);
    if (t.device() != device)
      fail("{} {} is on {}, the model needs it on {}", what, e.name, t.device().str(), device.str());
    if (t.dtype() != dt)
      fail("{} {}: expected dtype {}, found {}", what, e.name, dtype_safetensors_name(dt),
           dtype_safetensors_name(t.dtype()));
    if (t.shape() != shape)
      fail("{} {}: expected shape {}, found {}", what, e.name, shape_str(shape), shape_str(t.shape()));
  }
}

namespace {

// Under expert parallelism the stacked expert tensors (parameters and gradients) hold this rank's experts only.
void check_params(const DecoderSpec& c, const ModelWeights& w, const char* what, DType dtype,
                  const ExpertParallel* ep, bool frozen_allowed = false) {
  weights_check(c, w, what, dtype, Device::cpu(), ep ? ep->experts_per_rank : -1, frozen_allowed);
}

void check_lora(const DecoderSpec& c, const LoraWeights& l, const char* what) {
  if (!l.table) fail("{}: LoRA weights without a table", what);
  if (static_cast<int64_t>(l.layers.size()) != c.num_layers())
    fail("LoRA {}s have {} layers, config num_hidden_layers is {}", what, l.layers.size(), c.num_layers());
  for (const LoraEntry& e : l.table->entries) {
    const Tensor& t = l.slot(e);
    if (!t.defined()) fail("LoRA {} {} is missing", what, e.name);
    if (t.dtype() != DType::F32 || !t.device().is_cpu())
      fail("LoRA {} {}: expected F32 on the CPU, found {}", what, e.name, t.desc());
    if (t.shape() != e.shape)
      fail("LoRA {} {}: expected shape {}, found {}", what, e.name, shape_str(e.shape), shape_str(t.shape()));
  }
}

}  // namespace

void model_config_check(const DecoderSpec& c) {
  auto need = [](bool ok, const char* field, int64_t v) {
    if (!ok) fail("config: {} = {} is not supported by the model", field, v);
  };
  auto refuse = [](bool bad, const std::string& what) {
    if (bad) fail("config: {} is not supported by the model", what);
  };
  spec_check(c, "config");  // sublayer indices in range (a spec made in code has not been through from_json)
  need(c.vocab_size > 0, "vocab_size", c.vocab_size);
  need(c.hidden_size > 0, "hidden_size", c.hidden_size);
  for (const Mamba2Spec& m : c.mamba2) {
    // Nemotron-H's mixer (layers/mamba2_mixer_block.h).
    need(m.heads > 0, "mamba_num_heads", m.heads);
    need(m.head_dim > 0, "mamba_head_dim", m.head_dim);
    need(m.state > 0, "ssm_state_size", m.state);
    need(m.groups > 0 && m.heads % m.groups == 0, "n_groups", m.groups);
    need(m.conv_kernel > 0, "conv_kernel", m.conv_kernel);
    need(m.chunk > 0, "chunk_size", m.chunk);
    refuse(!(m.norm_eps > 0) || !(m.time_step_min >= 0), "a Mamba2 norm eps <= 0 or a negative time_step_min");
  }
  for (const AttentionSpec& a : c.attention) {
    need(a.heads > 0, "num_attention_heads", a.heads);
    need(a.kv_heads > 0 && a.heads % a.kv_heads == 0, "num_key_value_heads", a.kv_heads);
    // RoPE rotates pairs of dims; without it (Nemotron-H's NoPE) any size goes.
    need(a.head_dim > 0 && (a.head_dim % 2 == 0 || a.rope.kind == RopeKind::none), "head_dim", a.head_dim);
    refuse(a.scale < 0, "a negative attention scale");
    if (a.kind == AttentionKind::mla) {
      refuse(a.rope.kind == RopeKind::none, "multi-head latent attention without RoPE");
      // DeepSeek-V3's MLA (layers/mla_attention_block.h): RoPE on the rope dims only, as many key/value heads as
      // query heads, no biases, sinks, window or QK-norm.
      need(a.kv_heads == a.heads, "num_key_value_heads", a.kv_heads);
      need(a.qk_nope_head_dim >= 0, "qk_nope_head_dim", a.qk_nope_head_dim);
      need(a.qk_rope_head_dim > 0 && a.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", a.qk_rope_head_dim);
      need(a.head_dim == a.qk_nope_head_dim + a.qk_rope_head_dim, "qk_head_dim", a.head_dim);
      need(a.rope.rotary_dim == a.qk_rope_head_dim, "rotary dims", a.rope.rotary_dim);
      need(a.q_lora_rank >= 0, "q_lora_rank", a.q_lora_rank);
      need(a.kv_lora_rank > 0, "kv_lora_rank", a.kv_lora_rank);
      need(a.value_dim() > 0, "v_head_dim", a.value_dim());
      refuse(a.qk_norm || a.qkv_bias || a.o_bias || a.sinks || a.sliding_window != 0 || a.eager_bf16,
             "MLA with QK-norm, biases, sinks, a sliding window or eager bf16 softmax");
      continue;
    }
    refuse(a.kind != AttentionKind::gqa, "this attention kind");
    refuse(a.v_head_dim != 0 && a.v_head_dim != a.head_dim, "a value head size unlike the key's (outside MLA)");
    refuse(a.rope.kind != RopeKind::none && (a.rope.interleaved || a.rope.rotary_dim != 0),
           "a RoPE other than the half split over the whole head (default or YaRN)");
  }
  for (const MlpSpec& m : c.mlp)
    refuse(m.activation == Activation::swiglu_oai || m.bias, "an MLP other than SwiGLU or ReLU² without biases");
  for (const MoeSpec& m : c.moe) {
    refuse(m.expert.activation == Activation::relu2 && m.expert.bias, "ReLU² experts with biases");
    if (m.router.score == RouterScore::sigmoid_group) {
      // DeepSeek-V3's router (kernels/cpu/router_sigmoid_group.h): fp32 linear without a bias, the correction bias.
      refuse(m.router.linear_bias || !m.router.correction_bias, "a sigmoid router with a linear bias or without "
                                                                "its correction bias");
      refuse(m.aux_loss_on, "the load-balancing loss with a sigmoid router");
      cpu::SigmoidGroupRouting r;
      r.top_k = m.experts_per_token;
      r.groups = m.router.groups;
      r.topk_groups = m.router.topk_groups;
      r.scale = m.router.scale;
      cpu::check_sigmoid_group_routing(r, m.num_experts);
    } else {
      refuse(m.router.correction_bias || m.router.scale != 1.0 || m.router.groups != 1,
             "a correction bias, scaled weights or expert groups with a softmax router");
    }
    if (m.shared_expert)
      refuse(m.shared_expert->activation == Activation::swiglu_oai || m.shared_expert->bias ||
                 m.shared_expert->intermediate_size <= 0,
             "a shared expert other than a SwiGLU or ReLU² MLP without biases");
  }
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    for (const Sublayer& sub : c.layers[static_cast<size_t>(l)].sublayers) {
      if (sub.kind == SublayerKind::moe) {
        const MoeSpec& m = c.moe[static_cast<size_t>(sub.index)];
        need(m.expert.intermediate_size > 0, "moe_intermediate_size", m.expert.intermediate_size);
        need(m.experts_per_token >= 1 && m.experts_per_token <= m.num_experts, "num_experts_per_tok",
             m.experts_per_token);
      } else if (sub.kind == SublayerKind::mlp) {
        const MlpSpec& m = c.mlp[static_cast<size_t>(sub.index)];
        need(m.intermediate_size > 0, "intermediate_size", m.intermediate_size);
      }
    }
    // A layer's weights hold at most one token mixer (attention or Mamba2) and one feed-forward (MLP or MoE)
    // sublayer, in either order: the norm before each is chosen by its kind (model_weights.h WeightSlot: input_norm,
    // post_norm).
    const std::vector<Sublayer>& subs = c.layers[static_cast<size_t>(l)].sublayers;
    int attention = 0, mamba2 = 0, feed_forward = 0;
    for (const Sublayer& sub : subs) {
      attention += sub.kind == SublayerKind::attention;
      mamba2 += sub.kind == SublayerKind::mamba2;
      feed_forward += sub.kind == SublayerKind::mlp || sub.kind == SublayerKind::moe;
    }
    if (subs.empty()) fail("config: layer {} has no sublayer", l);
    if (attention > 1 || feed_forward > 1)
      fail("config: layer {} has {} attention and {} MLP/MoE sublayers; a layer holds at most one of each", l,
           attention, feed_forward);
    if (mamba2 > 0 && attention + mamba2 > 1)  // both read input_norm
      fail("config: layer {} has {} attention and {} Mamba2 sublayers; a layer holds at most one token mixer", l,
           attention, mamba2);
  }
}

namespace {

// The attention block of the spec's kind (GQA or MLA), keeping its intermediates in the matching acts.
Tensor attention_forward_any(const BlockEnv& env, const AttentionSpec& a, const LayerWeights& w, const Tensor& x,
                             AttentionBlockActs* gqa, MlaBlockActs* mla, const LayerLora* lora) {
  return a.kind == AttentionKind::mla ? mla_attention_block_forward(env, a, w, x, mla, lora)
                                      : attention_block_forward(env, a, w, x, gqa, lora);
}

struct Prepared {
  BlockEnv env;
  Tensor targets;  // I64 [T] shifted labels, or undefined
};

Prepared prepare_batch(const DecoderSpec& c, const Batch& b, bool bf16, bool document_mask,
                       const ExpertParallel* ep) {
  batch_validate(c, b);
  Prepared p;
  p.env.spec = &c;
  p.env.batch = b.input_ids.dim(0);
  p.env.seq = b.input_ids.dim(1);
  p.env.bf16 = bf16;
  p.env.ep = ep;
  if (document_mask) p.env.doc_ids = batch_document_ids(b);
  p.env.rope = RopeTableSet::build(c, batch_positions(b), bf16);
  if (b.labels.defined()) p.targets = cpu::causal_lm_targets(b.labels, c.vocab_size);
  return p;
}

bool aux_enabled(const DecoderSpec& c) { return c.aux_loss_on(); }

int64_t count_targets(const Tensor& targets) {
  int64_t n = 0;
  const int64_t* y = targets.data_as<int64_t>();
  for (int64_t i = 0; i < targets.numel(); ++i) n += y[i] != -100;
  return n;
}

double ce_divisor(const LossOptions& o, int64_t count) {
  if (o.ce_divisor < 0) fail("loss options: ce_divisor must be >= 0, found {}", o.ce_divisor);
  return o.ce_divisor > 0 ? o.ce_divisor : static_cast<double>(count);
}

}  // namespace

void batch_validate(const DecoderSpec& c, const Batch& b) {
  const Tensor& ids = b.input_ids;
  if (!ids.defined() || ids.dtype() != DType::I64 || ids.ndim() != 2 || ids.dim(0) < 1 || ids.dim(1) < 1)
    fail("batch: input_ids must be I64 [B, S] with B, S >= 1, found {}", ids.defined() ? ids.desc() : "none");
  MT_CHECK(ids.device().is_cpu(), "batch: input_ids must be on the CPU, found {}", ids.device().str());
  const int64_t B = ids.dim(0), S = ids.dim(1);
  auto check_like = [&](const Tensor& t, const char* name) {
    if (t.defined() && (t.dtype() != DType::I64 || t.shape() != ids.shape() || !t.device().is_cpu()))
      fail("batch: {} must be I64 {} like input_ids on the CPU, found {}", name, shape_str(ids.shape()), t.desc());
  };
  check_like(b.labels, "labels");
  check_like(b.position_ids, "position_ids");
  const int64_t* ip = ids.data_as<int64_t>();
  for (int64_t i = 0; i < B * S; ++i)
    if (ip[i] < 0 || ip[i] >= c.vocab_size)
      fail("batch: input_ids[{}, {}] = {} is outside the vocabulary [0, {})", i / S, i % S, ip[i], c.vocab_size);
}

Tensor batch_positions(const Batch& b) {
  if (b.position_ids.defined()) return b.position_ids;
  const int64_t B = b.input_ids.dim(0), S = b.input_ids.dim(1);
  Tensor pos = Tensor::empty({B, S}, DType::I64);
  int64_t* pp = pos.data_as<int64_t>();
  for (int64_t r = 0; r < B; ++r)
    for (int64_t s = 0; s < S; ++s) pp[r * S + s] = s;
  return pos;
}

Tensor batch_document_ids(const Batch& b) {
  if (!b.position_ids.defined()) return Tensor();
  const int64_t B = b.position_ids.dim(0), S = b.position_ids.dim(1);
  // Packed documents: a break wherever the position does not step by exactly 1.
  const int64_t* pp = b.position_ids.data_as<int64_t>();
  bool packed = false;
  Tensor doc = Tensor::empty({B, S}, DType::I32);
  int32_t* dp = doc.data_as<int32_t>();
  for (int64_t r = 0; r < B; ++r) {
    int32_t d = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (s > 0 && pp[r * S + s] - pp[r * S + s - 1] != 1) {
        ++d;
        packed = true;
      }
      dp[r * S + s] = d;
    }
  }
  return packed ? doc : Tensor();
}

DecoderModel::DecoderModel(const DecoderSpec& cfg, ModelWeights& weights, const ModelOptions& opts)
    : cfg_(cfg), w_(weights), opts_(opts) {
  model_config_check(cfg_);
  if (!w_.embed.defined()) fail("parameter model.embed_tokens.weight is missing");
  const DType dt = w_.embed.dtype();
  if (dt != DType::F32 && dt != DType::BF16)
    fail("parameter model.embed_tokens.weight: dtype {} is not supported (F32 or BF16)",
         dtype_safetensors_name(dt));
  check_params(cfg_, w_, "parameter", dt, opts_.expert_parallel);
  bf16_ = dt == DType::BF16;
  if (opts_.expert_load) {
    MT_CHECK(static_cast<int64_t>(opts_.expert_load->size()) == cfg_.num_layers(), "expert loads of {} layers for {}",
             opts_.expert_load->size(), cfg_.num_layers());
    for (int64_t l = 0; l < cfg_.num_layers(); ++l)
      for (const Sublayer& sub : cfg_.layers[static_cast<size_t>(l)].sublayers)
        if (sub.kind == SublayerKind::moe) {
          const Tensor& t = (*opts_.expert_load)[static_cast<size_t>(l)];
          MT_CHECK(t.defined() && t.dtype() == DType::I32 && t.shape() == Shape{cfg_.moe[static_cast<size_t>(sub.index)].num_experts},
                   "expert loads of layer {}: expected I32 [E], found {}", l, t.defined() ? t.desc() : "none");
        }
  }
  if (opts_.lora) {
    if (opts_.expert_parallel || opts_.residency)
      fail("LoRA: expert parallelism and sharded parameters are not supported with an adapter");
    check_lora(cfg_, *opts_.lora, "parameter");
  }
}

const LayerLora* DecoderModel::layer_lora(int64_t l) const {
  return opts_.lora ? &opts_.lora->layers[static_cast<size_t>(l)] : nullptr;
}

void DecoderModel::fetch(int64_t group) const {
  if (opts_.residency) opts_.residency->fetch(group);
}

void DecoderModel::release(int64_t group, bool backward_follows) const {
  if (opts_.residency) opts_.residency->release(group, backward_follows);
}

ForwardResult DecoderModel::forward(const Batch& b, bool want_logits, const LossOptions& o) {
  Prepared p = prepare_batch(cfg_, b, bf16_, opts_.packed_document_mask, opts_.expert_parallel);
  const BlockEnv& env = p.env;
  const bool aux_on = aux_enabled(cfg_);
  const int64_t nl = cfg_.num_layers();
  fetch(ParamResidency::kEmbedding);
  Tensor x = cpu::embedding_forward(b.input_ids.view({env.tokens()}), w_.embed);
  release(ParamResidency::kEmbedding, false);
  std::vector<Tensor> router_logits;
  for (int64_t l = 0; l < nl; ++l) {
    const auto& L = w_.layers[l];
    fetch(l);
    for (const Sublayer& sub : cfg_.layers[static_cast<size_t>(l)].sublayers) switch (sub.kind) {
        case SublayerKind::attention:
          x = attention_forward_any(env, cfg_.attention[static_cast<size_t>(sub.index)], L, x, nullptr, nullptr,
                                    layer_lora(l));
          break;
        case SublayerKind::moe: {
          MoeBlockActs acts;
          x = moe_block_forward(env, cfg_.moe[static_cast<size_t>(sub.index)], L, x, aux_on ? &acts : nullptr,
                                layer_lora(l));
          if (aux_on) router_logits.push_back(acts.logits);
          break;
        }
        case SublayerKind::mlp:
          x = mlp_block_forward(env, cfg_.mlp[static_cast<size_t>(sub.index)], L, x, nullptr, layer_lora(l));
          break;
        case SublayerKind::mamba2:
          x = mamba2_block_forward(env, cfg_.mamba2[static_cast<size_t>(sub.index)], L, x, nullptr, nullptr,
                                   layer_lora(l));
          break;
      }
    release(l, false);
  }
  const Tensor& head = cfg_.tie_word_embeddings ? w_.embed : w_.lm_head;
  fetch(ParamResidency::head(nl));
  LmHeadOutput lm = lm_head_forward(env, w_.final_norm, head, x, p.targets, want_logits);
  release(ParamResidency::head(nl), false);
  ForwardResult r;
  if (aux_on) r.aux_loss = cpu::aux_loss_forward(router_logits, cfg_.experts_per_token(), bf16_, nullptr);
  if (p.targets.defined()) {
    r.tokens = lm.count;
    const double div = ce_divisor(o, lm.count);
    r.ce_loss = div > 0 ? lm.ce_sum / div : 0.0;
    r.loss = r.ce_loss + (aux_on ? cfg_.aux_loss_coef() * r.aux_loss : 0.0);
  }
  if (want_logits) r.logits = lm.logits.view({env.batch, env.seq, cfg_.vocab_size});
  return r;
}

ForwardResult DecoderModel::forward_backward(const Batch& b, ModelWeights& grads, const LossOptions& o) {
  if (opts_.lora) fail("forward_backward: the model has a LoRA adapter; pass its gradient buffers");
  return forward_backward_impl(b, grads, nullptr, o);
}

ForwardResult DecoderModel::forward_backward(const Batch& b, ModelWeights& grads, LoraWeights& lora_grads,
                                             const LossOptions& o) {
  if (!opts_.lora) fail("forward_backward: LoRA gradient buffers given to a model without an adapter");
  check_lora(cfg_, lora_grads, "gradient");
  if (lora_grads.table->entries.size() != opts_.lora->table->entries.size())
    fail("LoRA gradients have {} tensors, the adapter {}", lora_grads.table->entries.size(),
         opts_.lora->table->entries.size());
  return forward_backward_impl(b, grads, &lora_grads, o);
}

ForwardResult DecoderModel::forward_backward_impl(const Batch& b, ModelWeights& grads, LoraWeights* lora_grads,
                                                  const LossOptions& o) {
  if (!b.labels.defined()) fail("batch: forward_backward needs labels");
  check_params(cfg_, grads, "gradient", DType::F32, opts_.expert_parallel, lora_grads != nullptr);
  Prepared p = prepare_batch(cfg_, b, bf16_, opts_.packed_document_mask, opts_.expert_parallel);
  const BlockEnv& env = p.env;
  const bool aux_on = aux_enabled(cfg_);
  const int64_t nl = cfg_.num_layers();

  // Forward, keeping every block input and its intermediates.
  Tensor ids = b.input_ids.view({env.tokens()});
  // Per layer and sublayer: its input and its block's intermediates (one of the four kinds).
  struct SublayerSaved {
    Tensor in;
    AttentionBlockActs attn;
    MlaBlockActs mla;
    MoeBlockActs moe;
    MlpBlockActs mlp;
    Mamba2BlockActs mamba2;
  };
  std::vector<std::vector<SublayerSaved>> saved(nl);
  fetch(ParamResidency::kEmbedding);
  Tensor x = cpu::embedding_forward(ids, w_.embed);
  release(ParamResidency::kEmbedding, false);  // its backward needs only the ids
  std::vector<Tensor> router_logits;
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < nl; ++l) {
    const auto& L = w_.layers[l];
    fetch(l);
    const std::vector<Sublayer>& subs = cfg_.layers[static_cast<size_t>(l)].sublayers;
    saved[l].resize(subs.size());
    for (size_t i = 0; i < subs.size(); ++i) {
      SublayerSaved& sv = saved[l][i];
      sv.in = x;
      const size_t k = static_cast<size_t>(subs[i].index);
      switch (subs[i].kind) {
        case SublayerKind::attention:
          x = attention_forward_any(env, cfg_.attention[k], L, x, &sv.attn, &sv.mla, layer_lora(l));
          break;
        case SublayerKind::moe:
          x = moe_block_forward(env, cfg_.moe[k], L, x, &sv.moe, layer_lora(l));
          if (opts_.expert_load) cpu::router_expert_load_add(sv.moe.route.index, (*opts_.expert_load)[l]);
          router_logits.push_back(sv.moe.logits);
          moe_layers.push_back(l);
          break;
        case SublayerKind::mlp: x = mlp_block_forward(env, cfg_.mlp[k], L, x, &sv.mlp, layer_lora(l)); break;
        case SublayerKind::mamba2:
          x = mamba2_block_forward(env, cfg_.mamba2[k], L, x, &sv.mamba2, nullptr, layer_lora(l));
          break;
      }
    }
    release(l, true);
  }

  ForwardResult r;
  const int64_t count = count_targets(p.targets);
  const double div = ce_divisor(o, count);
  const float scale = div > 0 ? static_cast<float>(1.0 / div) : 0.0f;
  const Tensor& head = cfg_.tie_word_embeddings ? w_.embed : w_.lm_head;
  Tensor& dhead = cfg_.tie_word_embeddings ? grads.embed : grads.lm_head;
  LmHeadOutput lm;
  fetch(ParamResidency::head(nl));
  Tensor dx = lm_head_forward_backward(env, w_.final_norm, head, x, p.targets, scale, grads.final_norm, dhead, &lm);
  release(ParamResidency::head(nl), false);
  r.tokens = lm.count;
  r.ce_loss = div > 0 ? lm.ce_sum / div : 0.0;

  std::vector<Tensor> dlogits_aux(nl);
  if (aux_on) {
    cpu::AuxLossSaved saved;
    r.aux_loss = cpu::aux_loss_forward(router_logits, cfg_.experts_per_token(), bf16_, &saved);
    std::vector<Tensor> d;
    for (const Tensor& t : router_logits) d.push_back(Tensor::zeros(t.shape(), DType::F32));
    cpu::aux_loss_backward(cfg_.aux_loss_coef(), router_logits, saved, bf16_, d);
    for (size_t i = 0; i < moe_layers.size(); ++i) dlogits_aux[moe_layers[i]] = d[i];
  }
  r.loss = r.ce_loss + (aux_on ? cfg_.aux_loss_coef() * r.aux_loss : 0.0);

  for (int64_t l = nl - 1; l >= 0; --l) {
    const auto& L = w_.layers[l];
    auto& G = grads.layers[l];
    const LayerLora* lora = layer_lora(l);
    LayerLora* dlora = lora_grads ? &lora_grads->layers[static_cast<size_t>(l)] : nullptr;
    fetch(l);
    const std::vector<Sublayer>& subs = cfg_.layers[static_cast<size_t>(l)].sublayers;
    for (size_t i = subs.size(); i-- > 0;) {
      SublayerSaved& sv = saved[l][i];
      const size_t k = static_cast<size_t>(subs[i].index);
      switch (subs[i].kind) {
        case SublayerKind::attention:
          dx = cfg_.attention[k].kind == AttentionKind::mla
                   ? mla_attention_block_backward(env, cfg_.attention[k], L, sv.in, sv.mla, dx, G, lora, dlora)
                   : attention_block_backward(env, cfg_.attention[k], L, sv.in, sv.attn, dx, G, lora, dlora);
          break;
        case SublayerKind::moe:
          dx = moe_block_backward(env, cfg_.moe[k], L, sv.in, sv.moe, dx, dlogits_aux[l], G, lora, dlora);
          break;
        case SublayerKind::mlp:
          dx = mlp_block_backward(env, cfg_.mlp[k], L, sv.in, sv.mlp, dx, G, lora, dlora);
          break;
        case SublayerKind::mamba2:
          dx = mamba2_block_backward(env, cfg_.mamba2[k], L, sv.in, sv.mamba2, dx, G, lora, dlora);
          break;
      }
      sv = {};
    }
    release(l, false);
  }
  // The pad row: no gradient, as in HF. A frozen embedding (LoRA): none at all.
  if (grads.embed.defined()) cpu::embedding_backward(ids, dx, grads.embed, cfg_.padding_idx);
  return r;
}

}  // namespace mt
