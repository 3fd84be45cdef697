// The CUDA model against the CPU reference model (both BF16 parameters, Transformers' bf16 rounding
// points on the CPU): loss, aux loss and every parameter gradient of one micro-batch with packed
// documents, ignored labels and the aux loss on, with MoE layers, dense MLP layers (mlp_only_layers,
// decoder_sparse_step) and a dense Qwen3; the recompute policies against each other.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../../kernels/cuda/error_report.h"
#include "cuda_model_test_util.h"
#include "core/error.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/kernel_launch.cuh"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/presets.h"
#include "models/decoder_model.h"

namespace mt {
namespace {

nlohmann::json small_config_json(int64_t head_dim, int64_t top_k) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["hidden_size"] = 128;
  j["head_dim"] = head_dim;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["moe_intermediate_size"] = 64;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = top_k;
  j["num_hidden_layers"] = 2;
  j["output_router_logits"] = true;
  j["router_aux_loss_coef"] = 0.02;
  j["initializer_range"] = 0.05;
  return j;
}

DecoderSpec small_config(int64_t head_dim, int64_t top_k = 2) {
  return DecoderSpec::from_json(small_config_json(head_dim, top_k), "test-config");
}

// Where small_config's dense MLP layers are (intermediate_size 200: a multiple of 8, not of a tile).
enum class DenseLayers {
  mlp_only_1,     // mlp_only_layers [1]: layer 0 MoE, layer 1 dense
  sparse_step_2,  // decoder_sparse_step 2: layer 0 dense, layer 1 MoE
  all,            // a dense Qwen3 (Qwen3ForCausalLM): no experts at all
};

const char* dense_layers_name(DenseLayers d) {
  return d == DenseLayers::mlp_only_1 ? "mlp_only_layers [1]"
         : d == DenseLayers::sparse_step_2 ? "decoder_sparse_step 2"
                                           : "dense Qwen3";
}

nlohmann::json dense_config_json(DenseLayers d, int64_t head_dim, int64_t top_k) {
  nlohmann::json j = small_config_json(head_dim, top_k);
  j["intermediate_size"] = 200;
  if (d == DenseLayers::mlp_only_1) {
    j["mlp_only_layers"] = {1};
  } else if (d == DenseLayers::sparse_step_2) {
    j["decoder_sparse_step"] = 2;
  } else {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
    for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                          "mlp_only_layers", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef"})
      j.erase(k);
  }
  return j;
}

DecoderSpec dense_config(DenseLayers d, int64_t head_dim, int64_t top_k) {
  return DecoderSpec::from_json(dense_config_json(d, head_dim, top_k), dense_layers_name(d));
}

using test::device_zeros_like;
using test::test_batch;
using test::to_device_weights;

struct CudaRun {
  double ce = 0, aux = 0;
  int64_t count = 0;
  ModelWeights grads;
};

// all_head_rows: the LM head runs over every row (the batch's target_rows cleared), not only those with a
// target.
CudaRun run_cuda(const DecoderSpec& cfg, ModelWeights& dev_w, const Batch& b, Recompute rc, double div,
                 bool all_head_rows = false) {
  CudaModelOptions o;
  o.recompute = rc;
  o.loss_chunk_rows = 64;  // several chunks
  DecoderCudaModel model(cfg, dev_w, 0, o);
  CudaBatch gb = cuda_batch_upload(cfg, b, 0);
  if (all_head_rows) gb.target_rows = gb.row_targets = Tensor();
  CudaRun r;
  r.grads = device_zeros_like(cfg);
  CudaLoss l = model.forward_backward(gb, r.grads, div);
  r.ce = cuda::to_host(l.ce_sum).to_floats()[0] / div;
  r.count = cuda::to_host(l.count).data_as<int32_t>()[0];
  r.aux = l.aux.defined() ? cuda::to_host(l.aux).to_floats()[0] : 0.0;
  return r;
}

struct Tolerance {
  double loss, aux, max_norm, rel_l2;
};

void expect_matches_cpu(const DecoderSpec& cfg, const Tolerance& tol) {
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 7);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);

  DecoderModel cpu(cfg, host_w);
  ModelWeights cpu_g = ModelWeights::zeros_like_config(cfg, DType::F32);
  ForwardResult want = cpu.forward_backward(b, cpu_g);
  ASSERT_GT(want.tokens, 0);

  CudaRun got = run_cuda(cfg, dev_w, b, Recompute::none, static_cast<double>(want.tokens));
  EXPECT_EQ(got.count, want.tokens);
  EXPECT_NEAR(got.ce, want.ce_loss, tol.loss * want.ce_loss);
  EXPECT_NEAR(got.aux, want.aux_loss, tol.aux * want.aux_loss);

  // Loss through forward() agrees with forward_backward's.
  {
    DecoderCudaModel m(cfg, dev_w, 0);
    CudaBatch gb = cuda_batch_upload(cfg, b, 0);
    CudaLoss l = m.forward(gb);
    EXPECT_NEAR(cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(want.tokens), got.ce, 1e-5 * got.ce);
  }

  test::expect_gradients_near(got.grads, cpu_g, {tol.max_norm, tol.rel_l2});
}

// Every expert selected (top-k = E): no routing decision can flip between the two implementations, so
// what remains is bf16 activations on both sides with different accumulation orders and rounding points.
TEST(CudaDecoderModel, MatchesCpuBf16AllExpertsRouted) {
  MT_SKIP_WITHOUT_CUDA();
  for (int64_t head_dim : {64, 128}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    expect_matches_cpu(small_config(head_dim, 8), {5e-3, 1e-2, 0.06, 0.03});
  }
}

// Top-2 of 8: the same, plus routing decisions on near-ties that bf16 noise can flip (a token then trains
// another expert), which moves the router and expert gradients by more: 0.35 max-norm / 0.2 rel-L2. Limits
// derived per gradient from the CPU model's own bf16-vs-fp32 distance (3x that distance, by the
// triangle inequality) were tried and do not hold: the GPU flips other near-ties than the CPU bf16 model does
// (measured on an H200: layer 0 router gradient 0.33 max-norm / 0.19 rel-L2 from the CPU bf16 model, where
// the CPU bf16 model is 0.02 / 0.018 from its fp32 run). Which near-ties flip is not a rounding bound, so this
// test stays loose on routed gradients; routing itself is checked decision by decision against Transformers
// in GpuVsTransformers (tests/models/cuda/gpu_vs_transformers_test.cpp), and without routing decisions
// (MatchesCpuBf16AllExpertsRouted) the limits are tight.
TEST(CudaDecoderModel, MatchesCpuBf16TopTwo) {
  MT_SKIP_WITHOUT_CUDA();
  expect_matches_cpu(small_config(64, 2), {5e-3, 2e-2, 0.35, 0.2});
}

// Dense MLP layers (layers/cuda/mlp_block_cuda.h) in the model. Top-k = E in the MoE layers, so no routing
// decision can flip and the all-experts-routed limits apply to every gradient, the dense MLP's included (its
// numerics are the experts' without the routing weight: two bf16 GEMM outputs, HF's two SwiGLU roundings, a
// bf16 down GEMM). The dense Qwen3 has no aux loss on either side (0 == 0).
TEST(CudaDecoderModel, DenseLayersMatchCpuBf16) {
  MT_SKIP_WITHOUT_CUDA();
  for (DenseLayers d : {DenseLayers::mlp_only_1, DenseLayers::sparse_step_2, DenseLayers::all})
    for (int64_t head_dim : {64, 128}) {
      SCOPED_TRACE(std::string(dense_layers_name(d)) + ", head_dim " + std::to_string(head_dim));
      const DecoderSpec cfg = dense_config(d, head_dim, 8);
      ASSERT_EQ(cfg.is_moe_layer(0), d == DenseLayers::mlp_only_1);
      ASSERT_EQ(cfg.is_moe_layer(1), d == DenseLayers::sparse_step_2);
      expect_matches_cpu(cfg, {5e-3, 1e-2, 0.06, 0.03});
    }
}

// Recompute none | selective | full against each other, through MoE and dense layers alike (see below).
void expect_recompute_policies_agree(const DecoderSpec& cfg) {
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 11);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  const CudaRun none = run_cuda(cfg, dev_w, b, Recompute::none, 100.0);
  for (Recompute rc : {Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(rc));
    const CudaRun r = run_cuda(cfg, dev_w, b, rc, 100.0);
    EXPECT_EQ(r.ce, none.ce);  // the forward is deterministic: same bits
    EXPECT_EQ(r.aux, none.aux);
    // recomputed tensors are bitwise the forward's; only the flash backward's fp32 atomics may reorder sums
    test::expect_gradients_near(r.grads, none.grads, {2e-3, 1e-3});
  }
}

TEST(CudaDecoderModel, RecomputePoliciesAgree) {
  MT_SKIP_WITHOUT_CUDA();
  expect_recompute_policies_agree(small_config(64));
}

TEST(CudaDecoderModel, RecomputePoliciesAgreeWithDenseLayers) {
  MT_SKIP_WITHOUT_CUDA();
  for (DenseLayers d : {DenseLayers::sparse_step_2, DenseLayers::all}) {
    SCOPED_TRACE(dense_layers_name(d));
    expect_recompute_policies_agree(dense_config(d, 64, 2));
  }
}

// Programmatic dependent launch (kernels launched while the previous one drains, each waiting in
// griddepcontrol.wait before touching memory) must not change a result: a kernel that read its input before
// the wait would see the previous step's data here and move the loss or the gradients by far more than the
// flash backward's atomic reordering does.
TEST(CudaDecoderModel, ProgrammaticDependentLaunchChangesNoResult) {
  MT_SKIP_WITHOUT_CUDA();
  cuda::pdl_set_enabled(1);
  const bool available = cuda::pdl_enabled();
  if (!available) {
    cuda::pdl_set_enabled(-1);
    GTEST_SKIP() << "programmatic dependent launch needs compute capability 9.0";
  }
  const DecoderSpec cfg = small_config(128, 2);
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 5);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  cuda::pdl_set_enabled(0);
  const CudaRun off = run_cuda(cfg, dev_w, b, Recompute::none, 100.0);
  cuda::pdl_set_enabled(1);
  const CudaRun on = run_cuda(cfg, dev_w, b, Recompute::none, 100.0);
  const CudaRun on_full = run_cuda(cfg, dev_w, b, Recompute::full, 100.0);
  cuda::pdl_set_enabled(-1);
  EXPECT_EQ(on.ce, off.ce);  // the forward is deterministic: same bits
  EXPECT_EQ(on.aux, off.aux);
  EXPECT_EQ(on_full.ce, off.ce);
  for (const CudaRun* r : {&on, &on_full}) test::expect_gradients_near(r->grads, off.grads, {2e-3, 1e-3});
}

// The head runs on the rows that have a target only: the batch lists them, and skipping the others changes
// neither the loss nor any gradient (the full-rows run differs only by the GEMMs' row count; the scatter
// leaves exact zeros in the ignored rows' input gradient, and a wrong row would move every gradient below
// the head by far more than 1e-3).
TEST(CudaDecoderModel, HeadSkipsRowsWithoutTargets) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = small_config(64);
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 13);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  {
    const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
    ASSERT_TRUE(gb.target_rows.defined());
    const Tensor rows = cuda::to_host(gb.target_rows), targets = cuda::to_host(gb.row_targets);
    const Tensor all = cuda::to_host(gb.targets);
    ASSERT_EQ(rows.numel(), gb.target_count);
    int64_t n = 0;
    for (int64_t t = 0; t < all.numel(); ++t) {
      if (all.data_as<int64_t>()[t] == -100) continue;
      ASSERT_LT(n, rows.numel());
      EXPECT_EQ(rows.data_as<int32_t>()[n], t);
      EXPECT_EQ(targets.data_as<int64_t>()[n], all.data_as<int64_t>()[t]);
      ++n;
    }
    EXPECT_EQ(n, rows.numel());
    EXPECT_LT(n, all.numel() - 2);  // both rows' last token and every 7th label are ignored
  }
  const CudaRun part = run_cuda(cfg, dev_w, b, Recompute::none, 100.0);
  const CudaRun full = run_cuda(cfg, dev_w, b, Recompute::none, 100.0, /*all_head_rows=*/true);
  EXPECT_EQ(part.count, full.count);
  EXPECT_NEAR(part.ce, full.ce, 1e-5 * full.ce);
  test::expect_gradients_near(part.grads, full.grads, {2e-3, 1e-3});
}

// A micro-batch without a single target (a prompt-only window): no loss, no head or final-norm gradient,
// and the rest of the model still trains on the aux loss alone.
TEST(CudaDecoderModel, MicroBatchWithoutTargetsHasNoLossGradient) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = small_config(64);
  ModelWeights host_w = ModelWeights::random_init(cfg, DType::BF16, 17);
  ModelWeights dev_w = to_device_weights(host_w);
  Batch b = test_batch(cfg);
  for (int64_t i = 0; i < b.labels.numel(); ++i) b.labels.data_as<int64_t>()[i] = -100;
  const CudaRun r = run_cuda(cfg, dev_w, b, Recompute::none, 1.0);
  EXPECT_EQ(r.count, 0);
  EXPECT_EQ(r.ce, 0.0);
  EXPECT_GT(r.aux, 0.0);
  for (const auto& [name, g] : r.grads.named_parameters()) {
    const std::vector<float> v = test::device_floats(*g);
    const bool head = name == "lm_head.weight" || name == "model.norm.weight";
    double sq = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << name;
      sq += static_cast<double>(x) * x;
    }
    if (head) {
      EXPECT_EQ(sq, 0.0) << name;
    } else if (name.find("mlp.gate.weight") != std::string::npos) {
      EXPECT_GT(sq, 0.0) << name << ": the aux loss trains the router";
    }
  }
}

TEST(CudaDecoderModel, RefusesFp32Parameters) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = small_config(64);
  ModelWeights f32 = ModelWeights::random_init(cfg, DType::F32, 1);
  ModelWeights dev = to_device_weights(f32);
  try {
    DecoderCudaModel m(cfg, dev, 0);
    FAIL() << "F32 parameters accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected dtype BF16"), std::string::npos) << e.what();
  }
}

// What the CUDA model refuses is a pure function of the config (no GPU needed): dense layers are accepted, but
// their intermediate_size must be a multiple of 8 (the gate and up halves of the MLP block's [T, 2F] buffer
// stay 16-byte aligned), and only when the config has a dense layer.
TEST(CudaDecoderModel, UnsupportedReasonChecksTheDenseIntermediateSize) {
  for (DenseLayers d : {DenseLayers::mlp_only_1, DenseLayers::sparse_step_2, DenseLayers::all}) {
    SCOPED_TRACE(dense_layers_name(d));
    EXPECT_EQ(cuda_model_unsupported_reason(dense_config(d, 64, 2)), "");
    nlohmann::json j = dense_config_json(d, 64, 2);
    j["intermediate_size"] = 100;
    EXPECT_EQ(cuda_model_unsupported_reason(DecoderSpec::from_json(j, "odd")),
              "intermediate_size 100 must be a multiple of 8 for the dense MLP layers' GEMMs");
  }
  nlohmann::json j = small_config_json(64, 2);  // MoE layers only: intermediate_size is unused
  j["intermediate_size"] = 100;
  EXPECT_EQ(cuda_model_unsupported_reason(DecoderSpec::from_json(j, "moe only")), "");
}

}  // namespace
}  // namespace mt
