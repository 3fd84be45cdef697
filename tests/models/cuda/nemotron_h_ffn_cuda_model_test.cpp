// The CUDA model on Nemotron-H's non-Mamba sublayers (models/families/nemotron_h.cpp: one sublayer per layer) against
// the CPU reference model, both with BF16 parameters (the CPU at Transformers' bf16 rounding points), on the
// nemotron-3-nano preset shrunk and with the Mamba2 layers left out (nemotron_h_cuda_model_test.cpp has them): layers
// "*E-E*-" = attention without positional encoding (GQA, no QK-norm: qr, kr are q, k), sigmoid-routed ReLU² experts
// (up alone, [E, I, H]; n_group = topk_group = 1, routed_scaling_factor 2.5, renormalised top-k, the fp32
// e_score_correction_bias, randomised here since Transformers' init is zeros) beside a ReLU² shared expert, and dense
// ReLU² MLPs. Loss and every parameter gradient of one micro-batch with packed documents and ignored labels
// (cuda_model_test_util.h test_batch); the recompute policies bitwise against each other; the batch's RoPE tables (none
// for NoPE). CudaAttentionNoRope: the same NoPE path with a QK-norm (the QK-norm alone, no rotation), on Qwen3-MoE's
// layers with rope none.
//
// Thresholds (the derivations of tests/models/cuda/deepseek_v3_cuda_model_test.cpp and qwen3_moe_cuda_model_test.cpp,
// which this follows; the sublayers are those blocks with ReLU² in place of SwiGLU, which has fewer roundings):
// - every expert routed (top-k = E): no routing decision can flip, so what remains is bf16 activations on both sides
//   with other accumulation orders and rounding points: loss 5e-3 relative, gradients 0.06 max-norm / 0.03 rel-L2 (the
//   router's, mixer.gate.weight / mlp.gate.weight, 0.1 / 0.06: its gradient goes through the routing weights' dot
//   products over H and the sigmoid's (or softmax's) derivative of bf16 d(logits) on the GPU, fp32 on the CPU);
// - top-2 of 8: near-ties that bf16 noise flips route a token elsewhere: 0.35 / 0.2 as DeepSeek-V3's top-2;
// - each limit raised to 3x the CPU bf16 gradient's own distance from the CPU fp32 one (the same bf16 weights) where
//   that is larger (the CPU flips on its own bf16 noise as much), as there;
// - recompute none | selective | full with train.deterministic: the recomputed tensors are bitwise the forward's and
//   every kernel sums in a fixed order, so loss and gradients are bitwise the same (as
//   CudaSublayerLayout.MixedLayoutMatchesCpuBf16 asserts for the other blocks).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../../fixture_dir.h"
#include "../../kernels/cuda/cuda_test_util.h"
#include "core/error.h"
#include "cuda_model_test_util.h"
#include "kernels/cuda/device_copy.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"
#include "models/presets.h"
#include "train/memory_plan.h"

namespace mt {
namespace {

using test::CudaRun;
using test::randomise_correction_bias;
using test::run_cuda;
using test::same_bits;
using test::test_batch;
using test::to_device_weights;

// The nemotron-3-nano preset at test size without Mamba2 layers: attention, MoE, MLP, MoE, attention, MLP; 4 / 2
// heads of 64, 8 ReLU² experts of 32 (top_k of them) + a shared expert of 48, MLPs of 96.
DecoderSpec nemotron_spec(int64_t top_k) {
  nlohmann::json j = preset_config_json("nemotron-3-nano-30b-a3b");
  j["hybrid_override_pattern"] = "*E-E*-";
  j["hidden_size"] = 64;
  j["head_dim"] = 64;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["intermediate_size"] = 96;
  j["moe_intermediate_size"] = 32;
  j["moe_shared_expert_intermediate_size"] = 48;
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = top_k;
  j["vocab_size"] = 256;
  j["initializer_range"] = 0.08;
  j["pad_token_id"] = 0;
  return DecoderSpec::from_json(j, "nemotron-h without mamba");
}

// Qwen3-MoE's test preset (QK-norm, MLP and MoE layers, all 8 experts routed) with its attention's RoPE removed.
DecoderSpec qwen_nope_spec() {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["hidden_size"] = 128;
  j["head_dim"] = 64;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["intermediate_size"] = 200;
  j["moe_intermediate_size"] = 64;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 8;
  j["num_hidden_layers"] = 2;
  j["mlp_only_layers"] = {1};
  j["initializer_range"] = 0.05;
  DecoderSpec s = DecoderSpec::from_json(j, "qwen nope");
  for (AttentionSpec& a : s.attention) a.rope.kind = RopeKind::none;
  return s;
}

test::GradLimit router_or(const std::string& name, test::GradLimit base) {
  const bool router = name.find(".mixer.gate.") != std::string::npos || name.find(".mlp.gate.") != std::string::npos;
  return router ? test::GradLimit{std::max(base.max_norm, 0.1), std::max(base.rel_l2, 0.06)} : base;
}

// Loss (forward_backward and forward) and every gradient of the CUDA model against the CPU model in bf16.
void expect_matches_cpu(const DecoderSpec& cfg, double loss_tol, test::GradLimit lim,
                        const std::vector<std::string>& must_have) {
  ASSERT_EQ(cuda_model_unsupported_reason(cfg), "");
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 7);
  randomise_correction_bias(host_w, 70);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  ModelWeights cpu_g = ModelWeights::zeros_like_config(cfg, DType::F32);
  const ForwardResult want = DecoderModel(cfg, host_w).forward_backward(b, cpu_g);
  ASSERT_GT(want.tokens, 0);
  ModelWeights w32 = host_w;  // the same bf16 values as F32: the CPU model in fp32, for bf16's own distance
  for (auto& [name, t] : w32.named_parameters()) *t = t->to(DType::F32);
  ModelWeights cpu32_g = ModelWeights::zeros_like_config(cfg, DType::F32);
  DecoderModel(cfg, w32).forward_backward(b, cpu32_g);
  const double div = static_cast<double>(want.tokens);
  const CudaRun got = run_cuda(cfg, dev_w, b, Recompute::none, div);
  EXPECT_EQ(got.count, want.tokens);
  EXPECT_NEAR(got.ce_sum / div, want.ce_loss, loss_tol * want.ce_loss);
  {  // forward() agrees with forward_backward's loss
    DecoderCudaModel m(cfg, dev_w, 0);
    const CudaLoss l = m.forward(cuda_batch_upload(cfg, b, 0));
    EXPECT_NEAR(cuda::to_host(l.ce_sum).to_floats()[0], got.ce_sum, 1e-5 * got.ce_sum);
  }
  for (const std::string& part : must_have) {
    bool seen = false;
    for (const auto& [name, t] : cpu_g.named_parameters()) seen |= name.find(part) != std::string::npos;
    EXPECT_TRUE(seen) << "no gradient named *" << part << "*";
  }
  auto want_p = cpu_g.named_parameters();
  auto fp32_p = cpu32_g.named_parameters();
  test::expect_gradients_near(got.grads, cpu_g, [&](size_t i, const std::string& name) {
    const test::ErrorStats noise = test::error_stats(want_p[i].second->to_floats(), fp32_p[i].second->to_floats());
    const test::GradLimit l = router_or(name, lim);
    return test::GradLimit{std::max(l.max_norm, 3 * noise.max_norm), std::max(l.rel_l2, 3 * noise.rel_l2)};
  });
  // The correction bias is a buffer: the device copy is untouched.
  for (size_t l = 0; l < host_w.layers.size(); ++l)
    if (host_w.layers[l].router_score_bias.defined()) {
      EXPECT_EQ(test::device_floats(dev_w.layers[l].router_score_bias), host_w.layers[l].router_score_bias.to_floats());
    }
}

const std::vector<std::string> kNemotronParts = {"mixer.experts.up_proj", "mixer.shared_experts.up_proj",
                                                 "mixer.up_proj", "mixer.q_proj"};

TEST(CudaNemotronHRelu2NoRope, MatchesCpuBf16AllExpertsRouted) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = nemotron_spec(8);
  ASSERT_EQ(cfg.num_layers(), 6);
  ASSERT_EQ(cfg.moe[0].expert.activation, Activation::relu2);
  ASSERT_EQ(cfg.moe[0].router.score, RouterScore::sigmoid_group);
  ASSERT_EQ(cfg.moe[0].router.scale, 2.5);
  ASSERT_EQ(cfg.attention[0].rope.kind, RopeKind::none);
  ASSERT_FALSE(cfg.attention[0].qk_norm);
  expect_matches_cpu(cfg, 5e-3, {0.06, 0.03}, kNemotronParts);
}

TEST(CudaNemotronHRelu2NoRope, MatchesCpuBf16TopTwo) {
  MT_SKIP_WITHOUT_CUDA();
  expect_matches_cpu(nemotron_spec(2), 5e-3, {0.35, 0.2}, kNemotronParts);
}

TEST(CudaNemotronHRelu2NoRope, RecomputePoliciesAgreeBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = nemotron_spec(2);
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 11);
  randomise_correction_bias(host_w, 90);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  const CudaRun none = run_cuda(cfg, dev_w, b, Recompute::none, 100.0, true);
  for (Recompute rc : {Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(rc));
    const CudaRun r = run_cuda(cfg, dev_w, b, rc, 100.0, true);
    EXPECT_TRUE(same_bits({r.ce_sum}, {none.ce_sum})) << r.ce_sum << " vs " << none.ce_sum;
    const auto g = r.grads.named_parameters(), w = none.grads.named_parameters();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i)
      EXPECT_TRUE(same_bits(test::device_floats(*g[i].second), test::device_floats(*w[i].second)))
          << "gradient " << g[i].first << " differs";
  }
}

// NoPE needs no RoPE table: the batch uploads none for a spec whose attention has no rotation.
TEST(CudaNemotronHRelu2NoRope, BatchHasNoRopeTable) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = nemotron_spec(2);
  const CudaBatch gb = cuda_batch_upload(cfg, test_batch(cfg), 0);
  EXPECT_TRUE(gb.rope_tables.empty());
  EXPECT_THROW(gb.rope_table(cfg.attention[0]), Error);  // and nothing asks for one
}

// What the CUDA engine refuses in Nemotron-H configurations, in one line (no GPU needed).
TEST(CudaNemotronHRelu2NoRope, RefusalsNameTheSize) {
  EXPECT_EQ(cuda_model_unsupported_reason(nemotron_spec(2)), "");
  // The fixture's mixer: in_proj 64 + 128 + 4 = 196 wide.
  // fixture_dir: the binary may run on the GPU machine, away from the tree it was built in.
  const DecoderSpec hybrid =
      DecoderSpec::from_file((test::fixture_dir("nemotron_h/hybrid_all_kinds") / "ckpt/config.json").string());
  const std::string why = cuda_model_unsupported_reason(hybrid);
  EXPECT_NE(why.find("in_proj width 196"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  DecoderSpec odd = nemotron_spec(2);
  odd.mlp[0].intermediate_size = 100;
  EXPECT_EQ(cuda_model_unsupported_reason(odd),
            "intermediate_size 100 must be a multiple of 8 for the dense MLP layers' GEMMs");
  DecoderSpec shared = nemotron_spec(2);
  shared.moe[0].shared_expert->intermediate_size = 44;
  EXPECT_EQ(cuda_model_unsupported_reason(shared),
            "the shared expert's intermediate size 44 must be a multiple of 8 for its GEMMs");
  DecoderSpec biased = nemotron_spec(2);
  biased.mlp[0].bias = true;
  EXPECT_EQ(cuda_model_unsupported_reason(biased),
            "a dense MLP with biases or an activation other than SwiGLU and ReLU² has no CUDA kernels yet");
}

// NoPE with a QK-norm: the per-head RMSNorm alone (no rotation) forward and backward, q_norm / k_norm gradients.
TEST(CudaAttentionNoRope, QkNormMatchesCpuBf16) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = qwen_nope_spec();
  ASSERT_TRUE(cfg.attention[0].qk_norm);
  expect_matches_cpu(cfg, 5e-3, {0.06, 0.03}, {"self_attn.q_norm", "self_attn.k_norm"});
  EXPECT_TRUE(cuda_batch_upload(cfg, test_batch(cfg), 0).rope_tables.empty());
}

TEST(CudaAttentionNoRope, QkNormRecomputePoliciesAgreeBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = qwen_nope_spec();
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 13);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  const CudaRun none = run_cuda(cfg, dev_w, b, Recompute::none, 100.0, true);
  for (Recompute rc : {Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(rc));
    const CudaRun r = run_cuda(cfg, dev_w, b, rc, 100.0, true);
    EXPECT_TRUE(same_bits({r.ce_sum}, {none.ce_sum})) << r.ce_sum << " vs " << none.ce_sum;
    const auto g = r.grads.named_parameters(), w = none.grads.named_parameters();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i)
      EXPECT_TRUE(same_bits(test::device_floats(*g[i].second), test::device_floats(*w[i].second)))
          << "gradient " << g[i].first << " differs";
  }
}

}  // namespace
}  // namespace mt
