// The CUDA model on Nemotron-H (nemotron_h_cuda_test_util.h: the hybrid M E M * E - layout of
// tests/fixtures/nemotron_h/hybrid_all_kinds at sizes the GEMMs take) against the CPU reference model, both with BF16
// parameters (the CPU at Transformers' bf16 rounding points): loss and every parameter gradient of one micro-batch
// with packed documents and ignored labels (cuda_model_test_util.h test_batch: the second row holds three documents,
// so the conv window and the scan state restart inside a row), the recompute policies against each other, and a
// packed row against its documents run as separate rows.
//
// Thresholds (the rule of tests/models/cuda/deepseek_v3_cuda_model_test.cpp): loss 5e-3 relative, gradients 0.06
// max-norm / 0.03 rel-L2, the router's 0.1 / 0.06 — each raised to 3x the CPU bf16 gradient's own distance from the
// CPU fp32 one (the same bf16 weights) where that is larger: top-2 of 8 sigmoid scores has near-ties that bf16 noise
// flips on either engine, and the Mamba2 chain rounds conv, silu, dt and the gated norm's output to bf16 at points
// where an fp32-order difference upstream can flip a rounding, so a fixed limit would test the draw, not the kernels.
// Recompute none | selective | full: the forward is deterministic (the same loss bits; the Mamba2 kernels recompute
// bitwise), only the flash backward's fp32 atomics may reorder sums: 2e-3 / 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../../kernels/cuda/error_report.h"
#include "core/error.h"
#include "cuda_model_test_util.h"
#include "kernels/cuda/device_copy.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"
#include "models/presets.h"
#include "nemotron_h_cuda_test_util.h"

namespace mt {
namespace {

using test::CudaRun;
using test::nemotron_test_spec;
using test::run_cuda;
using test::test_batch;
using test::to_device_weights;

test::GradLimit grad_limit(const std::string& name, test::GradLimit base) {
  const bool router = name.find(".mixer.gate.") != std::string::npos;
  return router ? test::GradLimit{0.1, 0.06} : base;
}

TEST(CudaNemotronH, SpecIsAcceptedAndPresetToo) {
  EXPECT_EQ(cuda_model_unsupported_reason(nemotron_test_spec()), "");
  EXPECT_EQ(cuda_model_unsupported_reason(
                DecoderSpec::from_json(preset_config_json("nemotron-3-nano-30b-a3b"), "nemotron-3-nano-30b-a3b")),
            "");
}

TEST(CudaNemotronH, MatchesCpuBf16) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = nemotron_test_spec();
  ASSERT_EQ(cuda_model_unsupported_reason(cfg), "");
  ModelWeights host_w = test::nemotron_random_weights(cfg, 7);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  ModelWeights cpu_g = ModelWeights::zeros_like_config(cfg, DType::F32);
  const ForwardResult want = DecoderModel(cfg, host_w).forward_backward(b, cpu_g);
  ASSERT_GT(want.tokens, 0);
  ModelWeights w32 = host_w;  // the same bf16 values as F32: the CPU model in fp32, for bf16's own distance
  for (auto& [name, t] : w32.named_parameters()) *t = t->to(DType::F32);
  ModelWeights cpu32_g = ModelWeights::zeros_like_config(cfg, DType::F32);
  const ForwardResult want32 = DecoderModel(cfg, w32).forward_backward(b, cpu32_g);
  const CudaRun got = run_cuda(cfg, dev_w, b, Recompute::none, static_cast<double>(want.tokens));
  EXPECT_EQ(got.count, want.tokens);
  EXPECT_FALSE(got.aux);  // Nemotron-H adds no load-balancing loss
  // The loss: within 5e-3 of the CPU bf16, or of the CPU fp32 by as much as the CPU bf16 is from it (triangle).
  const double loss_tol = std::max(5e-3 * want.ce_loss, 3 * std::abs(want.ce_loss - want32.ce_loss));
  EXPECT_NEAR(got.ce, want.ce_loss, loss_tol) << "CPU fp32 " << want32.ce_loss;
  {  // forward() agrees with forward_backward's loss
    DecoderCudaModel m(cfg, dev_w, 0);
    const CudaLoss l = m.forward(cuda_batch_upload(cfg, b, 0));
    EXPECT_NEAR(cuda::to_host(l.ce_sum).to_floats()[0] / static_cast<double>(want.tokens), got.ce, 1e-5 * got.ce);
  }
  bool saw_conv = false, saw_shared = false;
  for (const auto& [name, t] : cpu_g.named_parameters()) {
    saw_conv |= name.find("conv1d") != std::string::npos;
    saw_shared |= name.find("shared_experts") != std::string::npos;
  }
  EXPECT_TRUE(saw_conv && saw_shared);
  auto want_p = cpu_g.named_parameters();
  auto fp32_p = cpu32_g.named_parameters();
  test::expect_gradients_near(got.grads, cpu_g, [&](size_t i, const std::string& name) {
    const test::ErrorStats noise = test::error_stats(want_p[i].second->to_floats(), fp32_p[i].second->to_floats());
    const test::GradLimit l = grad_limit(name, {0.06, 0.03});
    return test::GradLimit{std::max(l.max_norm, 3 * noise.max_norm), std::max(l.rel_l2, 3 * noise.rel_l2)};
  });
}

TEST(CudaNemotronH, RecomputePoliciesAgree) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = nemotron_test_spec();
  ModelWeights host_w = test::nemotron_random_weights(cfg, 11);
  ModelWeights dev_w = to_device_weights(host_w);
  const Batch b = test_batch(cfg);
  const CudaRun none = run_cuda(cfg, dev_w, b, Recompute::none, 100.0);
  for (Recompute rc : {Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(rc));
    const CudaRun r = run_cuda(cfg, dev_w, b, rc, 100.0);
    EXPECT_EQ(r.ce, none.ce);
    test::expect_gradients_near(r.grads, none.grads, {2e-3, 1e-3});
  }
}

// A row of three packed documents equals the three documents as rows of their own: the conv window and the scan state
// restart at each document on the GPU too (Transformers' torch path would let them leak, tests/fixtures/README.md).
// The summed loss agrees to fp32 summation order plus attention's bf16 noise (the rows are padded to one length, so
// the GEMMs see other row counts): 2e-3 relative.
TEST(CudaNemotronH, PackedDocumentsEqualSeparateRows) {
  MT_SKIP_WITHOUT_CUDA();
  const DecoderSpec cfg = nemotron_test_spec();
  ModelWeights host_w = test::nemotron_random_weights(cfg, 13);
  ModelWeights dev_w = to_device_weights(host_w);
  const std::vector<int64_t> lens = {40, 30, 26};
  const int64_t S = 96;
  Batch packed;
  packed.input_ids = Tensor::empty({1, S}, DType::I64);
  packed.position_ids = Tensor::empty({1, S}, DType::I64);
  Batch rows;
  rows.input_ids = Tensor::empty({3, 40}, DType::I64);
  rows.labels = Tensor::empty({3, 40}, DType::I64);
  int64_t t = 0;
  for (size_t d = 0; d < lens.size(); ++d)
    for (int64_t p = 0; p < 40; ++p) {
      const int64_t id = static_cast<int64_t>((17 * d + 5 * p + p * p) % 250) + 2;
      rows.input_ids.data_as<int64_t>()[d * 40 + p] = id;
      rows.labels.data_as<int64_t>()[d * 40 + p] = p < lens[d] ? id : -100;
      if (p < lens[d]) {
        packed.input_ids.data_as<int64_t>()[t] = id;
        packed.position_ids.data_as<int64_t>()[t++] = p;
      }
    }
  packed.labels = packed.input_ids.clone();
  // A document's first token is no target of the one before it.
  for (int64_t d = 1, start = lens[0]; d < 3; start += lens[d++]) packed.labels.data_as<int64_t>()[start] = -100;
  packed.labels.data_as<int64_t>()[0] = -100;
  for (int64_t d = 0; d < 3; ++d) rows.labels.data_as<int64_t>()[d * 40] = -100;
  DecoderCudaModel m(cfg, dev_w, 0);
  const CudaLoss lp = m.forward(cuda_batch_upload(cfg, packed, 0));
  const CudaLoss lr = m.forward(cuda_batch_upload(cfg, rows, 0));
  const double sp = cuda::to_host(lp.ce_sum).to_floats()[0], sr = cuda::to_host(lr.ce_sum).to_floats()[0];
  EXPECT_EQ(cuda::to_host(lp.count).data_as<int32_t>()[0], cuda::to_host(lr.count).data_as<int32_t>()[0]);
  EXPECT_NEAR(sp, sr, 2e-3 * std::abs(sr));
}

}  // namespace
}  // namespace mt
