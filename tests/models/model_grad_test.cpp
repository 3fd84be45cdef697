// Whole-model checks on tiny random configs: finite differences of the loss against forward_backward
// for every parameter tensor (Qwen's layers and a mixed sublayer layout), packed documents against separate runs,
// losses options, bf16 mode, determinism across thread counts, and batch / parameter validation.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "core/float_convert.h"
#include "models/decoder_model.h"
#include "sublayer_layout_util.h"

namespace mt {
namespace {

DecoderSpec tiny_config(bool tied) {
  const nlohmann::json j = {
      {"architectures", {"Qwen3MoeForCausalLM"}},
      {"model_type", "qwen3_moe"},
      {"vocab_size", 23},
      {"hidden_size", 12},
      {"intermediate_size", 10},
      {"moe_intermediate_size", 5},
      {"num_hidden_layers", 3},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 6},  // != hidden / heads
      {"num_experts", 4},
      {"num_experts_per_tok", 2},
      {"mlp_only_layers", {1}},
      {"norm_topk_prob", true},
      {"tie_word_embeddings", tied},
      {"output_router_logits", true},
      {"router_aux_loss_coef", 0.1},  // large enough that the aux gradient is visible
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},
      {"initializer_range", 0.4},
  };
  return DecoderSpec::from_json(j, "tiny_config");
}

ModelWeights tiny_weights(const DecoderSpec& c, uint64_t seed) {
  ModelWeights w = ModelWeights::random_init(c, DType::F32, seed);
  // Norm weights away from 1 so their gradients are exercised non-trivially.
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 0.1f);
  for (auto& [name, t] : w.named_parameters())
    if (t->ndim() == 1)
      for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = 1.0f + d(g);
  // Buffers (DeepSeek-V3's selection bias) away from zero too, so that they steer the routing.
  for (const ParamEntry& e : w.param_table().entries())
    if (e.role == ParamRole::buffer)
      for (int64_t i = 0; i < w.slot(e).numel(); ++i) w.slot(e).data_as<float>()[i] = d(g);
  return w;
}

Tensor i64(const Shape& s, const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty(s, DType::I64);
  std::copy(v.begin(), v.end(), t.data_as<int64_t>());
  return t;
}

Batch tiny_batch(int64_t V, uint64_t seed) {
  const int B = 2, S = 7;
  std::mt19937_64 g(seed);
  std::vector<int64_t> ids(B * S), labels(B * S);
  for (auto& x : ids) x = (int64_t)(g() % V);
  for (int i = 0; i < B * S; ++i) labels[i] = (i % 5 == 3) ? -100 : ids[i];
  // Row 1 holds two packed documents (positions restart at 4).
  std::vector<int64_t> pos = {0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 0, 1, 2};
  return {i64({B, S}, ids), i64({B, S}, labels), i64({B, S}, pos)};
}

void check_gradients(const DecoderSpec& c, uint64_t weight_seed) {
  ModelWeights w = tiny_weights(c, weight_seed);
  DecoderModel m(c, w);
  Batch b = tiny_batch(c.vocab_size, 5);
  LossOptions o;
  o.ce_divisor = 1.0;  // CE sum: larger gradients relative to fp32 noise in the loss
  ModelWeights g = ModelWeights::zeros_like_config(c, DType::F32);
  const double L0 = m.forward_backward(b, g, o).loss;
  EXPECT_NEAR(m.forward(b, false, o).loss, L0, 1e-6 * std::fabs(L0));
  std::mt19937_64 rng(99);
  const float h = 2e-3f;
  int checked = 0, skipped = 0;
  auto params = w.named_parameters();
  auto grads = g.named_parameters();
  ASSERT_EQ(params.size(), grads.size());
  for (size_t p = 0; p < params.size(); ++p) {
    Tensor& t = *params[p].second;
    const float* gp = grads[p].second->data_as<float>();
    float* tp = t.data_as<float>();
    double gmax = 0;
    for (int64_t i = 0; i < t.numel(); ++i) gmax = std::max(gmax, (double)std::fabs(gp[i]));
    EXPECT_GT(gmax, 0.0) << params[p].first << " has an all-zero gradient";
    // Directional derivative along a random direction (aggregates many entries, robust to noise)...
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> dir(t.numel()), orig(tp, tp + t.numel());
    double analytic = 0;
    for (int64_t i = 0; i < t.numel(); ++i) dir[i] = nd(rng), analytic += (double)gp[i] * dir[i];
    auto at = [&](float s) {
      for (int64_t i = 0; i < t.numel(); ++i) tp[i] = orig[i] + s * dir[i];
      return m.forward(b, false, o).loss;
    };
    const double hd = 1e-3;
    const double lp = at(hd), lm = at(-hd);
    std::copy(orig.begin(), orig.end(), tp);
    const double fd_dir = (lp - lm) / (2 * hd);
    const double one_p = (lp - L0) / hd, one_m = (L0 - lm) / hd;
    if (std::fabs(one_p - one_m) > 0.2 * std::fabs(fd_dir) + 1e-2) {
      ++skipped;  // a top-k selection flipped inside the step
    } else {
      EXPECT_NEAR(analytic, fd_dir, 2e-2 * std::fabs(fd_dir) + 2e-3) << params[p].first << " (direction)";
      ++checked;
    }
    // ...and 4 single entries, preferring ones with a sizeable gradient.
    for (int k = 0; k < 4; ++k) {
      int64_t i = (int64_t)(rng() % t.numel());
      for (int tries = 0; tries < 8 && std::fabs(gp[i]) < 0.1 * gmax; ++tries) i = (int64_t)(rng() % t.numel());
      const float x0 = tp[i];
      tp[i] = x0 + h;
      const double ep = m.forward(b, false, o).loss;
      tp[i] = x0 - h;
      const double em = m.forward(b, false, o).loss;
      tp[i] = x0;
      const double fd = (ep - em) / (2 * h);
      const double sp = (ep - L0) / h, sm = (L0 - em) / h;
      if (std::fabs(sp - sm) > 0.2 * std::fabs(fd) + 2e-2) {
        ++skipped;
        continue;
      }
      EXPECT_NEAR(gp[i], fd, 2e-2 * std::fabs(fd) + 2e-3 * std::max(1.0, gmax))
          << params[p].first << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 5 * skipped) << "too many routing flips to check gradients";
}

TEST(ModelGrad, FiniteDifferencesUntied) { check_gradients(tiny_config(false), 12); }
TEST(ModelGrad, FiniteDifferencesTied) { check_gradients(tiny_config(true), 11); }

// Layers of one sublayer and of two in either order (tests/models/sublayer_layout_util.h): every parameter,
// the norms before each kind included, gets the loss's derivative.
TEST(ModelGrad, FiniteDifferencesMixedSublayers) {
  check_gradients(test::with_layout(tiny_config(false), test::mixed_layout()), 13);
}

// DeepSeek-V3 (tiny): MLA with a q LoRA, interleaved YaRN RoPE and mscale in the softmax scale, or a plain q_proj
// with the half-split default RoPE; a dense first layer, then sigmoid group-routed experts with a shared expert.
// The fp32 correction bias is a buffer: random here so that it steers the selection, never differentiated.
DecoderSpec tiny_deepseek_v3(bool q_lora, int64_t dense_layers) {
  nlohmann::json j = {
      {"architectures", {"DeepseekV3ForCausalLM"}},
      {"vocab_size", 23},
      {"hidden_size", 12},
      {"intermediate_size", 10},
      {"moe_intermediate_size", 5},
      {"num_hidden_layers", 3},
      {"num_attention_heads", 3},
      {"kv_lora_rank", 5},
      {"qk_nope_head_dim", 4},
      {"qk_rope_head_dim", 4},
      {"v_head_dim", 3},
      {"n_routed_experts", 4},
      {"num_experts_per_tok", 2},
      {"n_group", q_lora ? 2 : 1},
      {"topk_group", 1},
      {"n_shared_experts", 1},
      {"routed_scaling_factor", 1.7},
      {"norm_topk_prob", q_lora},
      {"first_k_dense_replace", dense_layers},
      {"rms_norm_eps", 1e-6},
      {"initializer_range", 0.4},
  };
  if (q_lora) {
    j["q_lora_rank"] = 6;
    j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"mscale", 1.0},
                            {"mscale_all_dim", 0.8}, {"original_max_position_embeddings", 16}};
  } else {
    j["q_lora_rank"] = nullptr;
    j["rope_interleave"] = false;
  }
  return DecoderSpec::from_json(j, "tiny_deepseek_v3");
}

TEST(ModelGrad, FiniteDifferencesDeepseekV3Mla) {
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora ? "q LoRA, interleaved YaRN" : "q_proj, half-split default RoPE");
    check_gradients(tiny_deepseek_v3(q_lora, /*dense_layers=*/3), 14);
  }
}

TEST(ModelGrad, FiniteDifferencesDeepseekV3) {
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora ? "2 groups, renormalised" : "1 group, not renormalised");
    check_gradients(tiny_deepseek_v3(q_lora, /*dense_layers=*/1), 15);
  }
}

// Nemotron-H (tiny): every layer kind ("M*E-M": Mamba2 mixers with several scan chunks in a 7-token row and a packed
// row, NoPE attention, sigmoid-routed ReLU² experts with a ReLU² shared expert, a ReLU² MLP). The first config has
// in_proj/out_proj biases, no conv bias and a dt floor some tokens sit on (the clamp passes no gradient there); the
// second two Mamba groups of two heads and a conv bias. What the fixtures do not cover (use_bias) is checked here.
DecoderSpec tiny_nemotron_h(bool proj_bias) {
  const nlohmann::json j = {
      {"architectures", {"NemotronHForCausalLM"}},
      {"vocab_size", 23},
      {"hidden_size", 12},
      {"hybrid_override_pattern", "M*E-M"},
      {"intermediate_size", 10},
      {"moe_intermediate_size", 5},
      {"moe_shared_expert_intermediate_size", 7},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 5},  // odd: no RoPE to need pairs
      {"mamba_num_heads", 4},
      {"mamba_head_dim", 3},
      {"n_groups", proj_bias ? 1 : 2},
      {"ssm_state_size", 4},
      {"conv_kernel", 3},
      {"chunk_size", 3},
      {"use_bias", proj_bias},
      {"use_conv_bias", !proj_bias},
      {"time_step_min", proj_bias ? 1.0 : 0.001},
      {"n_routed_experts", 4},
      {"num_experts_per_tok", 2},
      {"routed_scaling_factor", 1.7},
      {"norm_topk_prob", proj_bias},
      {"layer_norm_epsilon", 1e-6},
      {"initializer_range", 0.4},
  };
  return DecoderSpec::from_json(j, "tiny_nemotron_h");
}

TEST(ModelGrad, FiniteDifferencesNemotronH) {
  for (bool proj_bias : {true, false}) {
    SCOPED_TRACE(proj_bias ? "projection biases, one group, dt floor 1.0" : "conv bias, two groups");
    check_gradients(tiny_nemotron_h(proj_bias), 16);
  }
}

// DecoderSpec::padding_idx (Transformers' nn.Embedding(padding_idx)): the forward is unchanged, the embedding
// backward skips the pad id's tokens, so untied its row's gradient is exactly zero; tied, the head's gradient still
// reaches the shared row (as it does HF's tied weight) and only the lookup's part is gone. Every other gradient is
// bit for bit the one without a padding index.
TEST(ModelGrad, PadRowGetsNoEmbeddingGradient) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const DecoderSpec c = tiny_config(tied);
    ModelWeights w = tiny_weights(c, 31);
    const Batch b = tiny_batch(c.vocab_size, 5);
    const int64_t pad = b.input_ids.data_as<int64_t>()[2], H = c.hidden_size;
    DecoderSpec cp = c;
    cp.padding_idx = pad;
    DecoderModel m(c, w), mp(cp, w);
    ModelWeights g = ModelWeights::zeros_like_config(c, DType::F32), gp = ModelWeights::zeros_like_config(c, DType::F32);
    EXPECT_EQ(mp.forward_backward(b, gp).loss, m.forward_backward(b, g).loss);
    auto named = g.named_parameters(), named_p = gp.named_parameters();
    for (size_t i = 0; i < named.size(); ++i) {
      const std::vector<float> x = named[i].second->to_floats(), y = named_p[i].second->to_floats();
      if (named[i].second != &g.embed) {
        EXPECT_EQ(x, y) << named[i].first;
        continue;
      }
      for (int64_t v = 0; v < c.vocab_size; ++v) {
        const std::vector<float> rx(x.begin() + v * H, x.begin() + (v + 1) * H),
            ry(y.begin() + v * H, y.begin() + (v + 1) * H);
        if (v != pad) {
          EXPECT_EQ(rx, ry) << "row " << v;
        } else {
          EXPECT_NE(rx, std::vector<float>(H, 0.0f)) << "without a padding index the row gets the lookup's gradient";
          EXPECT_NE(rx, ry);
          if (tied) {
            EXPECT_NE(ry, std::vector<float>(H, 0.0f)) << "the head's gradient reaches the tied row";
          } else {
            EXPECT_EQ(ry, std::vector<float>(H, 0.0f));
          }
        }
      }
    }
  }
}

TEST(ModelForward, PackedDocumentsEqualSeparateRuns) {
  DecoderSpec c = tiny_config(false);
  ModelWeights w = tiny_weights(c, 21);
  DecoderModel m(c, w);
  std::vector<int64_t> a = {3, 7, 1, 9}, d = {4, 4, 20};
  std::vector<int64_t> both = a;
  both.insert(both.end(), d.begin(), d.end());
  Batch packed{i64({1, 7}, both), Tensor(), i64({1, 7}, {0, 1, 2, 3, 0, 1, 2})};
  auto lp = m.forward(packed, true).logits.to_floats();
  auto la = m.forward({i64({1, 4}, a), Tensor(), Tensor()}, true).logits.to_floats();
  auto ld = m.forward({i64({1, 3}, d), Tensor(), Tensor()}, true).logits.to_floats();
  la.insert(la.end(), ld.begin(), ld.end());
  ASSERT_EQ(la.size(), lp.size());
  // Not bitwise: 7 rows against 4 and 3 (and other rows per expert), for which the CPU BLAS may take other kernels
  // and blockings. Each fp32 dot product (K ≤ 12) is then within K·u·Σ|a·b| ≈ 7e-7·Σ|a·b| of the other; through
  // 3 layers and the head that stays a few ulps of the logits (|logit| ≤ 4.2 here, ulp 4.8e-7; measured ≤ 2 ulps
  // over OpenBLAS's x86-64 core types): we allow 1e-5.
  for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(lp[i], la[i], 1e-5) << i;
  // Without the document mask (HF with use_cache = true) the second document sees the first.
  ModelOptions no_mask;
  no_mask.packed_document_mask = false;
  DecoderModel mc(c, w, no_mask);
  auto lc = mc.forward(packed, true).logits.to_floats();
  double diff = 0;
  for (size_t i = 4 * 23; i < lc.size(); ++i) diff = std::max(diff, (double)std::fabs(lc[i] - lp[i]));
  EXPECT_GT(diff, 1e-3);
  // The first document's rows compute the same values either way, but not bitwise: the second document's tokens
  // route to other experts once they see the first, so the experts' GEMMs have other row counts (bound as above).
  for (size_t i = 0; i < 4 * 23; ++i) EXPECT_NEAR(lc[i], lp[i], 1e-5) << i;
}

TEST(ModelForward, LossOptionsAndIgnoredLabels) {
  DecoderSpec c = tiny_config(false);
  ModelWeights w = tiny_weights(c, 22);
  DecoderModel m(c, w);
  Batch b = tiny_batch(c.vocab_size, 6);
  ForwardResult mean = m.forward(b, false);
  EXPECT_EQ(mean.tokens, 9);  // 12 shifted targets; labels[0, 3], labels[1, 1] and labels[1, 6] are -100
  EXPECT_NEAR(mean.loss, mean.ce_loss + 0.1 * mean.aux_loss, 1e-12);
  EXPECT_GT(mean.aux_loss, 1.0);
  LossOptions o;
  o.ce_divisor = 40;
  ForwardResult sum = m.forward(b, false, o);
  EXPECT_NEAR(sum.ce_loss, mean.ce_loss * 9 / 40, 1e-6);
  // All labels ignored: CE 0, no NaN anywhere, gradients only from the aux loss.
  for (int64_t i = 0; i < b.labels.numel(); ++i) b.labels.data_as<int64_t>()[i] = -100;
  ModelWeights g = ModelWeights::zeros_like_config(c, DType::F32);
  ForwardResult r = m.forward_backward(b, g);
  EXPECT_EQ(r.tokens, 0);
  EXPECT_EQ(r.ce_loss, 0.0);
  EXPECT_NEAR(r.loss, 0.1 * r.aux_loss, 1e-12);
  for (auto& [name, t] : g.named_parameters())
    for (float v : t->to_floats()) ASSERT_TRUE(std::isfinite(v)) << name;
  for (float v : g.lm_head.to_floats()) EXPECT_EQ(v, 0.0f);
  // Aux off: loss is the CE alone and aux is reported 0.
  c.moe[0].aux_loss_on = false;
  DecoderModel m2(c, w);
  ForwardResult r2 = m2.forward(tiny_batch(c.vocab_size, 6), false);
  EXPECT_EQ(r2.aux_loss, 0.0);
  EXPECT_EQ(r2.loss, r2.ce_loss);
}

TEST(ModelForward, DeterministicAcrossThreadCounts) {
  DecoderSpec c = tiny_config(true);
  ModelWeights w = tiny_weights(c, 23);
  DecoderModel m(c, w);
  Batch b = tiny_batch(c.vocab_size, 7);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  ModelWeights g1 = ModelWeights::zeros_like_config(c, DType::F32);
  ForwardResult r1 = m.forward_backward(b, g1);
  omp_set_num_threads(std::max(2, saved));
  ModelWeights g2 = ModelWeights::zeros_like_config(c, DType::F32);
  ForwardResult r2 = m.forward_backward(b, g2);
  omp_set_num_threads(saved);
  // Bitwise by construction: the engine's OpenMP loops split rows or columns and reduce in a fixed order, and the
  // BLAS calls are the same shapes in the same order (omp_set_num_threads does not reach the pthread OpenBLAS; an
  // OpenMP OpenBLAS would follow it, but runs matrices this small, M·N·K < 2^18, on one thread).
  EXPECT_EQ(r1.loss, r2.loss);
  auto p1 = g1.named_parameters(), p2 = g2.named_parameters();
  for (size_t i = 0; i < p1.size(); ++i) EXPECT_EQ(p1[i].second->to_floats(), p2[i].second->to_floats()) << p1[i].first;
}

TEST(ModelForward, Bf16CloseToFp32OnTheSameWeights) {
  DecoderSpec c = tiny_config(false);
  ModelWeights w32 = tiny_weights(c, 24);
  ModelWeights w16 = ModelWeights::zeros_like_config(c, DType::BF16);
  auto src = w32.named_parameters(), dst = w16.named_parameters();
  for (size_t i = 0; i < src.size(); ++i) {
    dst[i].second->copy_from(*src[i].second);  // rounds to bf16
    src[i].second->copy_from(*dst[i].second);  // fp32 copy of the same values
  }
  DecoderModel m32(c, w32), m16(c, w16);
  EXPECT_TRUE(m16.bf16());
  Batch b = tiny_batch(c.vocab_size, 8);
  ModelWeights g32 = ModelWeights::zeros_like_config(c, DType::F32);
  ModelWeights g16 = ModelWeights::zeros_like_config(c, DType::F32);
  ForwardResult r32 = m32.forward_backward(b, g32), r16 = m16.forward_backward(b, g16);
  EXPECT_NE(r32.loss, r16.loss);  // the rounding emulation is active
  EXPECT_NEAR(r16.loss, r32.loss, 1e-2 * r32.loss);
  auto l16 = m16.forward(b, true).logits.to_floats();
  for (float v : l16) ASSERT_EQ(v, round_bf16(v));  // logits are bf16 values
  // Gradients: same direction (cosine) per tensor.
  auto a = g32.named_parameters(), d = g16.named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].second->to_floats(), y = d[i].second->to_floats();
    double xy = 0, xx = 0, yy = 0;
    for (size_t j = 0; j < x.size(); ++j) xy += (double)x[j] * y[j], xx += (double)x[j] * x[j], yy += (double)y[j] * y[j];
    EXPECT_GT(xy / std::sqrt(xx * yy + 1e-30), 0.95) << a[i].first;
  }
}

void expect_one_line_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one mentioning " << needle;
  } catch (const Error& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find(needle), std::string::npos) << s;
    EXPECT_EQ(s.find('\n'), std::string::npos) << s;
  }
}

TEST(ModelValidation, BadBatchesAndParameters) {
  DecoderSpec c = tiny_config(false);
  ModelWeights w = tiny_weights(c, 25);
  DecoderModel m(c, w);
  Batch b = tiny_batch(c.vocab_size, 9);
  b.input_ids.data_as<int64_t>()[3] = 23;
  expect_one_line_error([&] { m.forward(b, false); }, "input_ids[0, 3] = 23");
  b = tiny_batch(c.vocab_size, 9);
  b.labels.data_as<int64_t>()[8] = -7;
  expect_one_line_error([&] { m.forward(b, false); }, "labels[1, 1] = -7");
  b = tiny_batch(c.vocab_size, 9);
  b.position_ids = i64({1, 14}, std::vector<int64_t>(14, 0));
  expect_one_line_error([&] { m.forward(b, false); }, "position_ids");
  b = tiny_batch(c.vocab_size, 9);
  b.labels = Tensor();
  ModelWeights g = ModelWeights::zeros_like_config(c, DType::F32);
  expect_one_line_error([&] { m.forward_backward(b, g); }, "needs labels");
  expect_one_line_error([&] { m.forward({Tensor::empty({2, 0}, DType::I64), Tensor(), Tensor()}, false); },
                        "input_ids");
  ModelWeights g16 = ModelWeights::zeros_like_config(c, DType::BF16);
  expect_one_line_error([&] { m.forward_backward(tiny_batch(c.vocab_size, 9), g16); }, "gradient model.embed_tokens");
  LossOptions bad;
  bad.ce_divisor = -1;
  expect_one_line_error([&] { m.forward(tiny_batch(c.vocab_size, 9), false, bad); }, "ce_divisor");

  ModelWeights w2 = tiny_weights(c, 25);
  w2.layers[2].experts_down = Tensor::zeros({4, 12, 6}, DType::F32);
  expect_one_line_error([&] { DecoderModel x(c, w2); }, "model.layers.2.mlp.experts.down_proj");
  ModelWeights w3 = tiny_weights(c, 25);
  w3.lm_head = Tensor();
  expect_one_line_error([&] { DecoderModel x(c, w3); }, "lm_head.weight is missing");
  DecoderSpec cb = c;
  cb.attention[0].qkv_bias = true;
  expect_one_line_error([&] { DecoderModel x(cb, w); }, "model.layers.0.self_attn.q_proj.bias is missing");
}

}  // namespace
}  // namespace mt
