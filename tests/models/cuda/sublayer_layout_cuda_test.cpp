// The CUDA model on layers of other sublayer lists than Qwen's [attention, MLP | MoE]
// (tests/models/sublayer_layout_util.h):
// - Qwen3-MoE layers regrouped (one sublayer alone, MLP or MoE before an attention) compute the Qwen model bitwise
//   on the GPU: every sublayer reads the same weights and the fused norms add the same residuals, and with
//   train.deterministic every kernel sums in a fixed order. Under recompute none | selective | full.
// - A ZeRO-3 stand-in (PoisoningResidency: a released group's parameters are NaN until fetched again) changes no
//   bit of the loss or a gradient, for the Qwen layout and the mixed one: the model fetches each layer's group
//   before reading it, whatever the layer holds.
// - The mixed layout [[attention, MoE], [MoE], [attention], [MLP, attention], [attention, MLP]] against the CPU
//   bf16 model (tests/models/sublayer_layout_test.cpp checks the CPU model on it): loss, aux loss, the final
//   hidden state (through the logits it gives), every gradient, under each recompute policy; the recompute
//   policies bitwise against each other.
// - The batch's RoPE tables: one per distinct (RoPE, head_dim) among the attention configurations.
#include <gtest/gtest.h>

#include "../../fixture_dir.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../sublayer_layout_util.h"
#include "core/error.h"
#include "cuda_model_test_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/rope.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"
#include "models/param_residency.h"
#include "models/presets.h"
#include "train/sharded_params.h"

namespace mt {
namespace {

using K = SublayerKind;
using test::device_zeros_like;
using test::same_bits;
using test::test_batch;
using test::to_device_weights;

// Qwen3-MoE, 3 layers: [attention, MoE], [attention, MLP], [attention, MoE] (mlp_only_layers [1]); head_dim 64,
// 8 experts of which top_k route each token; aux loss on.
DecoderSpec qwen_spec(int64_t top_k, bool tied = false) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["hidden_size"] = 128;
  j["head_dim"] = 64;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["intermediate_size"] = 200;
  j["moe_intermediate_size"] = 64;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = top_k;
  j["num_hidden_layers"] = 3;
  j["mlp_only_layers"] = {1};
  j["output_router_logits"] = true;
  j["router_aux_loss_coef"] = 0.02;
  j["initializer_range"] = 0.05;
  j["tie_word_embeddings"] = tied;
  return DecoderSpec::from_json(j, "qwen_spec");
}

DecoderSpec mixed_spec(int64_t top_k, bool tied = false) {
  return test::with_layout(qwen_spec(top_k, tied), test::mixed_layout());
}

// A ZeRO-3 stand-in on one GPU: a group's parameters hold NaN (bf16 0xFFFF) except between its fetch and its
// release (groups as ShardedParams has them: the embedding, each layer, the head with a tied embedding), written
// on the model's stream, so a read outside fetch..release shows in the loss or a gradient. Restores every
// parameter when destroyed.
class PoisoningResidency final : public ParamResidency {
 public:
  PoisoningResidency(ModelWeights& w, const DecoderSpec& cfg) : stream_(cuda::device_context(0).stream) {
    const int64_t nl = cfg.num_layers();
    for (auto& [name, t] : w.named_parameters()) {
      Held h{t, Tensor::empty(t->shape(), t->dtype(), t->device())};
      MT_CUDA_CHECK(cudaMemcpyAsync(h.saved.data(), t->data(), t->nbytes(), cudaMemcpyDeviceToDevice, stream_));
      const int64_t g = ShardedParams::group_of(name, nl);
      groups_[g].push_back(held_.size());
      if (g == kEmbedding && cfg.tie_word_embeddings) groups_[head(nl)].push_back(held_.size());
      held_.push_back(h);
    }
    for (Held& h : held_) poison(h);
  }
  ~PoisoningResidency() override {
    for (Held& h : held_) restore(h);
    (void)cudaStreamSynchronize(stream_);
  }
  void fetch(int64_t g) override {
    if (present_[g]) return;
    present_[g] = true;
    for (size_t i : groups_[g])
      if (held_[i].users++ == 0) restore(held_[i]);
  }
  void release(int64_t g, bool) override {
    if (!present_[g]) return;
    present_[g] = false;
    for (size_t i : groups_[g])
      if (--held_[i].users == 0) poison(held_[i]);
  }
  bool any_present() const {
    return std::any_of(present_.begin(), present_.end(), [](const auto& p) { return p.second; });
  }

 private:
  struct Held {
    Tensor* t;
    Tensor saved;
    int users = 0;  // fetched groups holding it
  };
  void poison(Held& h) { MT_CUDA_CHECK(cudaMemsetAsync(h.t->data(), 0xFF, h.t->nbytes(), stream_)); }
  void restore(Held& h) {
    MT_CUDA_CHECK(cudaMemcpyAsync(h.t->data(), h.saved.data(), h.t->nbytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  cudaStream_t stream_;
  std::vector<Held> held_;
  std::map<int64_t, std::vector<size_t>> groups_;
  std::map<int64_t, bool> present_;
};

using test::CudaRun;

// Deterministic runs (the comparisons below are bit for bit).
CudaRun run_cuda(const DecoderSpec& cfg, ModelWeights& dev_w, const Batch& b, Recompute rc,
                 ParamResidency* residency = nullptr, double div = 100.0) {
  return test::run_cuda(cfg, dev_w, b, rc, div, /*deterministic=*/true, residency);
}

// got's loss and every gradient bit for bit want's; name_in_got maps want's parameter names to got's.
void expect_same_run(const CudaRun& got, const CudaRun& want, const std::string& what,
                     const std::function<std::string(const std::string&)>& name_in_got = {}) {
  EXPECT_EQ(got.count, want.count) << what;
  EXPECT_TRUE(same_bits({got.ce_sum, got.aux_value}, {want.ce_sum, want.aux_value}))
      << what << ": ce_sum " << got.ce_sum << " vs " << want.ce_sum << ", aux " << got.aux_value << " vs "
      << want.aux_value;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : got.grads.named_parameters()) by_name[name] = t;
  const auto w = want.grads.named_parameters();
  ASSERT_EQ(w.size(), by_name.size()) << what;
  for (const auto& [name, t] : w) {
    const std::string n = name_in_got ? name_in_got(name) : name;
    ASSERT_TRUE(by_name.count(n)) << what << ": no gradient " << n;
    EXPECT_TRUE(same_bits(test::device_floats(*by_name[n]), test::device_floats(*t)))
        << what << ": gradient " << name << " differs";
  }
}

const Recompute kPolicies[] = {Recompute::none, Recompute::selective, Recompute::full};

TEST(CudaSublayerLayout, RegroupedLayersComputeTheQwenModelBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec s = qwen_spec(2);  // top-2 of 8: real routing, the same on both sides bit for bit
  ModelWeights host_w = ModelWeights::random_init(s, DType::BF16, 21);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(s);
  for (Recompute rc : kPolicies) {
    const CudaRun want = run_cuda(s, dev_w, b, rc);
    ASSERT_GT(want.aux_value, 0.0f);
    for (const std::vector<int>& sizes : std::vector<std::vector<int>>{{2, 1, 2, 1}, {1, 2, 1, 1, 1}}) {
      const DecoderSpec r = test::regrouped(s, sizes);
      ModelWeights rw_host = test::regrouped_weights(s, sizes, host_w);
      ModelWeights rw = to_device_weights(rw_host);
      const CudaRun got = run_cuda(r, rw, b, rc);
      expect_same_run(got, want, std::string(recompute_name(rc)) + ", " + std::to_string(r.num_layers()) + " layers",
                      [&](const std::string& n) { return test::regrouped_name(s, sizes, n); });
    }
  }
}

// forward, forward_trace and forward_backward under the poisoning residency: bitwise the runs without it.
void expect_residency_changes_nothing(const DecoderSpec& cfg) {
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 23);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  for (Recompute rc : kPolicies) {
    SCOPED_TRACE(recompute_name(rc));
    const CudaRun want = run_cuda(cfg, dev_w, b, rc);
    CudaRun got;
    {
      PoisoningResidency res(dev_w, cfg);
      got = run_cuda(cfg, dev_w, b, rc, &res);
      EXPECT_FALSE(res.any_present()) << "a group is still fetched after forward_backward";
    }
    expect_same_run(got, want, "with the residency");
  }
  const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
  CudaModelOptions o;
  o.deterministic = true;
  DecoderCudaModel plain(cfg, dev_w, 0, o);
  const CudaLoss want = plain.forward(gb);
  const DecoderCudaModel::Trace want_trace = plain.forward_trace(gb);
  const std::vector<float> want_ce = test::device_floats(want.ce_sum);
  const std::vector<float> want_hidden = test::device_floats(want_trace.final_hidden);
  PoisoningResidency res(dev_w, cfg);
  o.residency = &res;
  DecoderCudaModel sharded(cfg, dev_w, 0, o);
  EXPECT_TRUE(same_bits(test::device_floats(sharded.forward(gb).ce_sum), want_ce)) << "forward";
  EXPECT_TRUE(same_bits(test::device_floats(sharded.forward_trace(gb).final_hidden), want_hidden)) << "forward_trace";
  EXPECT_FALSE(res.any_present());
}

TEST(CudaSublayerLayout, ResidencyFetchesEveryLayerBeforeReadingIt) {
  MT_SKIP_WITHOUT_CUDA();
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied embeddings" : "untied");
    {
      SCOPED_TRACE("Qwen layers");
      expect_residency_changes_nothing(qwen_spec(2, tied));
    }
    {
      SCOPED_TRACE("mixed layers");
      expect_residency_changes_nothing(mixed_spec(2, tied));
    }
  }
}

// The logits final_hidden · headᵀ (fp64 sums, rounded to bf16 as the CPU bf16 model's logits are), on the host.
std::vector<float> logits_of(const std::vector<float>& hidden, const Tensor& head, int64_t H) {
  const std::vector<float> hw = head.to_floats();
  const int64_t T = static_cast<int64_t>(hidden.size()) / H, V = head.dim(0);
  std::vector<float> out(static_cast<size_t>(T * V));
  for (int64_t r = 0; r < T; ++r)
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t h = 0; h < H; ++h) acc += double(hidden[r * H + h]) * hw[v * H + h];
      out[r * V + v] = round_bf16(static_cast<float>(acc));
    }
  return out;
}

// Top-k = E: no routing decision can flip between the two implementations, so the limits of
// CudaDecoderModel.MatchesCpuBf16AllExpertsRouted hold (loss 5e-3, aux 1e-2 relative; gradients 0.06 max-norm,
// 0.03 rel-L2, router weights 0.1 / 0.06 as in CudaHfFixture). Reused, not measured on this layout: five layers
// and seven sublayers instead of two and four. Logits: within 3x the CPU model's own bf16-vs-fp32 distance (floor
// one bf16 step), as CudaHfFixture.DenseLossAndLogitsMatchTransformersBf16 derives.
TEST(CudaSublayerLayout, MixedLayoutMatchesCpuBf16) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = mixed_spec(8);
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 7);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);

  DecoderModel cpu(cfg, host_w);
  ModelWeights cpu_g = ModelWeights::zeros_like_config(cfg, DType::F32);
  const ForwardResult want = cpu.forward_backward(b, cpu_g);
  ASSERT_GT(want.tokens, 0);
  ASSERT_GT(want.aux_loss, 0.0);
  const double div = static_cast<double>(want.tokens);

  std::vector<CudaRun> runs;
  for (Recompute rc : kPolicies) {
    SCOPED_TRACE(recompute_name(rc));
    CudaRun got = run_cuda(cfg, dev_w, b, rc, nullptr, div);
    EXPECT_EQ(got.count, want.tokens);
    EXPECT_NEAR(got.ce_sum / div, want.ce_loss, 5e-3 * want.ce_loss);
    EXPECT_NEAR(got.aux_value, want.aux_loss, 1e-2 * want.aux_loss);
    test::expect_gradients_near(got.grads, cpu_g,
                                [](size_t, const std::string& name) { return test::router_limit(name, {0.06, 0.03}); });
    runs.push_back(std::move(got));
  }
  // Recomputed tensors are bitwise the forward's (train.deterministic: no atomics anywhere).
  expect_same_run(runs[1], runs[0], "selective vs none");
  expect_same_run(runs[2], runs[0], "full vs none");

  // The final hidden state through the logits, and the routes: layers 0 and 1 hold a MoE sublayer.
  ModelWeights w32 = host_w;
  for (auto& [name, t] : w32.named_parameters()) *t = t->to(DType::F32);
  const std::vector<float> cpu16 = cpu.forward(b, true).logits.to_floats();
  const std::vector<float> cpu32 = DecoderModel(cfg, w32).forward(b, true).logits.to_floats();
  CudaModelOptions o;
  o.deterministic = true;
  DecoderCudaModel model(cfg, dev_w, 0, o);
  const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
  const DecoderCudaModel::Trace t = model.forward_trace(gb);
  const Tensor& head = cfg.tie_word_embeddings ? host_w.embed : host_w.lm_head;
  const std::vector<float> logits = logits_of(test::device_floats(t.final_hidden), head, cfg.hidden_size);
  const test::ErrorStats n = test::error_stats(cpu16, cpu32);
  const double floor = 1.0 / 256.0;
  test::expect_norm(logits, cpu16, std::max(3 * n.max_norm, floor), std::max(3 * n.rel_l2, floor), "logits");
  ASSERT_EQ(t.routes.size(), 5u);
  for (int64_t l = 0; l < 5; ++l) {
    EXPECT_EQ(t.routes[l].defined(), l < 2) << "layer " << l;
    if (l < 2) {
      EXPECT_EQ(t.routes[l].shape(), (Shape{gb.tokens(), 8})) << "layer " << l;
    }
  }
}

// The batch holds one RoPE table per distinct (RoPE, head_dim): configurations alike share one; each attention
// configuration finds its own, the table cuda::rope_tables makes for it.
TEST(CudaSublayerLayout, RopeTablePerDistinctConfiguration) {
  MT_SKIP_WITHOUT_CUDA();
  DecoderSpec cfg = qwen_spec(2);
  const AttentionSpec a = cfg.attention[0];
  AttentionSpec other_theta = a, other_dim = a, unknown = a;
  other_theta.rope.theta = 5e5;
  other_dim.head_dim = 128;
  unknown.rope.theta = 1234.0;
  cfg.attention = {a, other_theta, a, other_dim};
  const Batch b = test_batch(cfg);
  const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
  EXPECT_EQ(gb.rope_tables.size(), 3u);
  EXPECT_EQ(&gb.rope_table(cfg.attention[0]), &gb.rope_table(cfg.attention[2]));
  const Tensor positions = cuda::to_device(batch_positions(b).view({gb.tokens()}), 0);
  for (const AttentionSpec& x : {a, other_theta, other_dim}) {
    const CudaRopeTable& t = gb.rope_table(x);
    EXPECT_EQ(t.head_dim, x.head_dim);
    Tensor cos = Tensor::empty({gb.tokens(), x.head_dim / 2}, DType::F32, Device::cuda(0));
    Tensor sin = Tensor::empty({gb.tokens(), x.head_dim / 2}, DType::F32, Device::cuda(0));
    cuda::rope_tables(positions, x.head_dim, x.rope.theta, /*bf16=*/true, cos, sin, cuda::device_context(0).stream);
    EXPECT_TRUE(same_bits(test::device_floats(t.cos), test::device_floats(cos))) << x.head_dim << " " << x.rope.theta;
    EXPECT_TRUE(same_bits(test::device_floats(t.sin), test::device_floats(sin))) << x.head_dim << " " << x.rope.theta;
  }
  EXPECT_THROW(gb.rope_table(unknown), Error);
  // The Qwen spec has one attention configuration: one table, no extra memory or work.
  EXPECT_EQ(cuda_batch_upload(qwen_spec(2), b, 0).rope_tables.size(), 1u);
}

// What the CUDA model refuses is checked per sublayer configuration a layer uses (no GPU needed).
TEST(CudaSublayerLayout, UnsupportedReasonChecksEverySublayerConfiguration) {
  DecoderSpec cfg = mixed_spec(2);
  EXPECT_EQ(cuda_model_unsupported_reason(cfg), "");
  cfg.attention.push_back(cfg.attention[0]);
  cfg.attention[1].head_dim = 8;
  EXPECT_EQ(cuda_model_unsupported_reason(cfg), "");  // declared, no layer uses it
  cfg.layers[4].sublayers[0].index = 1;                // layer 4's attention now does
  EXPECT_NE(cuda_model_unsupported_reason(cfg).find("head_dim 8 has no flash-attention kernel"), std::string::npos)
      << cuda_model_unsupported_reason(cfg);
  DecoderSpec moe = mixed_spec(2);
  moe.moe.push_back(moe.moe[0]);
  moe.moe[1].expert.intermediate_size = 60;
  EXPECT_EQ(cuda_model_unsupported_reason(moe), "");
  moe.layers[1].sublayers[0].index = 1;
  EXPECT_EQ(cuda_model_unsupported_reason(moe),
            "hidden_size 128 and moe_intermediate_size 60 must be multiples of 8 for the grouped GEMM");
  DecoderSpec mlp = test::with_layout(qwen_spec(2), {{K::attention}, {K::mlp}});
  mlp.mlp[0].intermediate_size = 100;
  EXPECT_EQ(cuda_model_unsupported_reason(mlp),
            "intermediate_size 100 must be a multiple of 8 for the dense MLP layers' GEMMs");
}

// DeepSeek-V3 runs on the GPU (MLA, the sigmoid group router, shared experts); what the kernels lack is still refused
// in one line (no GPU needed): MLA head sizes without a flash kernel, more experts than the router kernel takes, a
// shared expert whose width the GEMMs cannot split.
TEST(CudaSublayerLayout, DeepseekV3RunsAndItsKernelLimitsAreRefused) {
  // fixture_dir: the binary may run on the GPU machine, away from the tree it was built in.
  const DecoderSpec dsv3 =
      DecoderSpec::from_file((test::fixture_dir("deepseek_v3/mla_yarn_dense1") / "ckpt/config.json").string());
  EXPECT_EQ(cuda_model_unsupported_reason(dsv3), "");
  DecoderSpec mla = dsv3;
  mla.attention[0].qk_nope_head_dim = 32, mla.attention[0].head_dim = 40;  // qk 40: no flash kernel
  EXPECT_NE(cuda_model_unsupported_reason(mla).find("multi-head latent attention: query/key head size 40"),
            std::string::npos)
      << cuda_model_unsupported_reason(mla);
  DecoderSpec routed = mixed_spec(2);
  routed.moe[0].router.score = RouterScore::sigmoid_group;
  routed.moe[0].router.correction_bias = true;
  routed.moe[0].aux_loss_on = false;
  EXPECT_EQ(cuda_model_unsupported_reason(routed), "");
  routed.moe[0].num_experts = 2048;
  EXPECT_EQ(cuda_model_unsupported_reason(routed),
            "the sigmoid group router's CUDA kernel takes up to 1024 experts and top-32 (found 2048 experts, top-2)");
  DecoderSpec shared = mixed_spec(2);
  shared.moe[0].shared_expert = MlpSpec{64, Activation::swiglu, false};
  EXPECT_EQ(cuda_model_unsupported_reason(shared), "");
  shared.moe[0].shared_expert->intermediate_size = 60;
  EXPECT_EQ(cuda_model_unsupported_reason(shared),
            "the shared expert's intermediate size 60 must be a multiple of 8 for its GEMMs");
}

}  // namespace
}  // namespace mt
