// The CUDA MLA attention block (layers/cuda/mla_attention_block_cuda.h) against the CPU block
// (layers/mla_attention_block.h) in bf16 mode, on two rows with packed documents (row 1 restarts its positions twice),
// bf16 weights of DeepSeek-V3 configurations shrunk (tests/models/cuda/dsv3_cuda_test_util.h): DeepSeek-V3's head
// sizes 192 / 128 (flash attention's MLA kernels, no padding) with a q LoRA rank, the fixtures' 32 / 16 (the value
// zero-padded to 32), a plain q_proj with the half-split RoPE. The CPU block's normalised input a goes to the GPU
// block, so both start from the same numbers; the GPU's da goes through the input norm's backward on the GPU (with
// the residual gradient) to compare with the CPU block's dx.
//
// Thresholds (bf16 unit roundoff u = 2^-9, a step 2^-8 ≈ 3.9e-3; max-norm relative to max|ref|):
// - Saved projections (qa, q, ckv, kv): the same bf16 inputs, fp32 accumulation in another order, one rounding;
//   downstream of a latent norm a rare rounding flip of its input moves a row by a step: 1e-2 / 5e-3.
// - y (o_proj's output): attention within about one bf16 rounding of the CPU's (tests/kernels/cuda/
//   flash_attention_mla_test.cpp: 1e-2 / 5e-3) on inputs within the above, then one more GEMM rounding: 2e-2 / 1e-2.
// - Gradients: the flash backward is within 2e-2 / 1e-2 of the CPU's on the same inputs; the GPU then rounds each
//   gradient it passes on (dq, dkv, dckv, the latent norms' input gradients, da: ≤ u each) where the CPU keeps fp32,
//   and each weight gradient sums T such terms: 0.06 max-norm / 0.03 rel-L2, the CUDA model tests' all-experts-routed
//   limits (tests/models/cuda/qwen3_moe_cuda_model_test.cpp), which cover the same chain of roundings. A wrong
//   column, a missing head sum of the rope key's gradient or RoPE's transpose applied the wrong way is an O(1) error.
// MT_PRINT_ERRORS=1 prints the measured errors.
#include "layers/cuda/mla_attention_block_cuda.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../../kernels/cuda/error_report.h"
#include "../../models/cuda/cuda_model_test_util.h"
#include "../../models/cuda/dsv3_cuda_test_util.h"
#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/phase_timer.h"
#include "kernels/cuda/rmsnorm.h"
#include "layers/mla_attention_block.h"
#include "models/cuda/cuda_batch.h"
#include "models/decoder_model.h"

namespace mt {
namespace {

// Two rows of S tokens; row 1 packs three documents.
Batch packed_batch(int64_t S) {
  Batch b;
  b.input_ids = Tensor::zeros({2, S}, DType::I64);
  b.position_ids = Tensor::empty({2, S}, DType::I64);
  int64_t* p = b.position_ids.data_as<int64_t>();
  for (int64_t s = 0; s < S; ++s) {
    p[s] = s;
    p[S + s] = s < S / 3 ? s : (s < 2 * S / 3 ? s - S / 3 : s - 2 * S / 3);
  }
  return b;
}

struct Env {
  DecoderSpec cfg;
  Batch b;
  BlockEnv cpu;
  CudaBatch gb;
  cuda::PhaseTimer timer;
  CudaBlockEnv gpu;
  Env(const test::MlaGeometry& g, int64_t S) {
    cfg = DecoderSpec::from_json(test::dsv3_test_json(g, 1, 1), "test");
    b = packed_batch(S);
    cpu.spec = &cfg;
    cpu.batch = 2;
    cpu.seq = S;
    cpu.bf16 = true;
    cpu.doc_ids = batch_document_ids(b);
    cpu.rope = RopeTableSet::build(cfg, batch_positions(b), true);
    gb = cuda_batch_upload(cfg, b, 0);
    gpu.cfg = &cfg;
    gpu.batch = &gb;
    gpu.device = 0;
    gpu.stream = cuda::device_context(0).stream;
    gpu.timer = &timer;
  }
};

std::vector<float> floats(const Tensor& t) { return test::floats_of(t); }

struct Run {
  Tensor y;
  MlaActsCuda acts;
};

void run_case(const test::MlaGeometry& g, int64_t S, uint64_t seed, const std::string& what) {
  SCOPED_TRACE(what);
  Env e(g, S);
  const AttentionSpec& spec = e.cfg.attention.at(0);
  ASSERT_EQ(spec.kind, AttentionKind::mla);
  ASSERT_EQ(mla_cuda_unsupported_reason(spec), "");
  const int64_t T = 2 * S, H = e.cfg.hidden_size, Hq = spec.heads, Dv = spec.value_dim();
  ModelWeights w = ModelWeights::random_init(e.cfg, DType::BF16, seed);
  {  // norm weights off 1, so their gradients and scaling are exercised
    LayerWeights& L = w.layers[0];
    for (Tensor* n : {&L.input_norm, &L.q_a_norm, &L.kv_a_norm}) {
      if (!n->defined()) continue;
      const std::vector<float> r = test::cuda_random_floats(static_cast<size_t>(n->numel()), seed + 99, 0.2f);
      std::vector<float> v(r.size());
      for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f + r[i];
      *n = Tensor::from_floats(n->shape(), v).to(DType::BF16);
    }
  }
  const LayerWeights& L = w.layers[0];
  const Tensor x = test::host_random({T, H}, seed + 1, 1.0f, true);
  const Tensor dy = test::host_random({T, H}, seed + 2, 1.0f, true);

  // CPU block.
  MlaBlockActs ca;
  mla_attention_block_forward(e.cpu, spec, L, x, &ca);
  const Tensor y_cpu = cpu::linear_forward(ca.o.view({T, Hq * Dv}), L.o_proj, true);
  ModelWeights cg = ModelWeights::zeros_like_config(e.cfg, DType::F32);
  const Tensor dx_cpu = mla_attention_block_backward(e.cpu, spec, L, x, ca, dy, cg.layers[0]);

  // GPU block on the CPU's normalised input.
  ModelWeights dw = test::to_device_weights(w);
  const LayerWeights& DL = dw.layers[0];
  MlaActsCuda ga;
  const Tensor a = test::device_from_host(ca.a, DType::BF16);
  const Tensor y = mla_attention_block_forward_cuda(e.gpu, spec, DL, a, ga);
  ASSERT_EQ(y.shape(), (Shape{T, H}));
  if (g.q_lora > 0) test::expect_norm(floats(ga.qa), ca.qa.to_floats(), 1e-2, 5e-3, "qa");
  test::expect_norm(floats(ga.q), ca.q.to_floats(), 1e-2, 5e-3, "q");
  test::expect_norm(floats(ga.ckv), ca.ckv.to_floats(), 1e-2, 5e-3, "ckv");
  test::expect_norm(floats(ga.kv), ca.kv.to_floats(), 1e-2, 5e-3, "kv");
  test::expect_norm(floats(ga.query), ca.query.to_floats(), 1e-2, 5e-3, "query");
  test::expect_norm(floats(ga.key), ca.key.to_floats(), 1e-2, 5e-3, "key");
  test::expect_norm(floats(ga.o_flat), ca.o.to_floats(), 2e-2, 1e-2, "attention output");
  test::expect_norm(floats(y), y_cpu.to_floats(), 2e-2, 1e-2, "y");

  // Backward, twice (deterministic flash backward): bitwise the same.
  e.gpu.deterministic = true;
  const Tensor ddy = test::device_from_host(dy, DType::BF16), dx_dev = test::device_from_host(x, DType::BF16);
  ModelWeights gg[2] = {test::device_zeros_like(e.cfg), test::device_zeros_like(e.cfg)};
  Tensor dx[2];
  for (int run = 0; run < 2; ++run) {
    const Tensor da = mla_attention_block_backward_cuda(e.gpu, spec, DL, ga, ddy, gg[run].layers[0]);
    ASSERT_EQ(da.shape(), (Shape{T, H}));
    dx[run] = e.gpu.bf16({T, H});
    cuda::rmsnorm_backward(da, dx_dev, DL.input_norm, e.gpu.eps(), dx[run], gg[run].layers[0].input_norm, &ddy,
                           e.gpu.stream);
  }
  test::expect_norm(floats(dx[0]), dx_cpu.to_floats(), 0.06, 0.03, "dx");
  EXPECT_EQ(floats(dx[1]), floats(dx[0])) << "dx differs between two deterministic runs";
  int compared = 0;
  auto gp = gg[0].named_parameters(), gp1 = gg[1].named_parameters(), cp = cg.named_parameters();
  for (size_t i = 0; i < cp.size(); ++i) {
    const std::string& name = cp[i].first;
    if (name.find("layers.0.self_attn.") == std::string::npos && name.find("input_layernorm") == std::string::npos)
      continue;
    ++compared;
    const std::vector<float> got = floats(*gp[i].second);
    test::expect_norm(got, cp[i].second->to_floats(), 0.06, 0.03, name);
    EXPECT_EQ(floats(*gp1[i].second), got) << name << " differs between two deterministic runs";
  }
  EXPECT_EQ(compared, g.q_lora > 0 ? 8 : 6);  // the projections, the latent norms, the input norm
}

TEST(CudaMlaBlock, DeepseekV3HeadSizesMatchCpuBlockBf16) {
  MT_SKIP_WITHOUT_CUDA();
  test::MlaGeometry g;  // 192 / 128, q LoRA 32, kv LoRA 32
  run_case(g, 67, 4100, "192/128, q LoRA");
  g.heads = 3;
  run_case(g, 130, 4200, "192/128, 3 heads, 130 tokens per row");
}

TEST(CudaMlaBlock, PaddedValueHeadSizesMatchCpuBlockBf16) {
  MT_SKIP_WITHOUT_CUDA();
  test::MlaGeometry g;
  g.heads = 4, g.nope = 24, g.rope = 8, g.v = 16, g.q_lora = 16, g.kv_lora = 16;  // the fixtures' sizes
  ASSERT_EQ(mla_value_pad(DecoderSpec::from_json(test::dsv3_test_json(g, 1, 1), "t").attention.at(0)), 32);
  run_case(g, 45, 4300, "32/16 (value padded to 32)");
}

TEST(CudaMlaBlock, PlainQueryProjectionAndSplitRopeMatchCpuBlockBf16) {
  MT_SKIP_WITHOUT_CUDA();
  test::MlaGeometry g;
  g.q_lora = 0;
  g.interleaved = false;
  run_case(g, 50, 4400, "plain q_proj, half-split RoPE");
}

// Selective recompute: the dropped tensors recomputed from the kept ones are bitwise the forward's.
TEST(CudaMlaBlock, RecomputedActivationsAreBitwiseTheForwards) {
  MT_SKIP_WITHOUT_CUDA();
  test::MlaGeometry g;
  Env e(g, 40);
  const AttentionSpec& spec = e.cfg.attention.at(0);
  const int64_t T = 80, H = e.cfg.hidden_size;
  ModelWeights w = ModelWeights::random_init(e.cfg, DType::BF16, 17);
  ModelWeights dw = test::to_device_weights(w);
  const LayerWeights& DL = dw.layers[0];
  const Tensor x = test::device_from_host(test::host_random({T, H}, 18, 1.0f, true), DType::BF16);
  Tensor a = e.gpu.bf16({T, H});
  cuda::rmsnorm_forward(x, DL.input_norm, e.gpu.eps(), a, nullptr, e.gpu.stream);
  MlaActsCuda acts;
  mla_attention_block_forward_cuda(e.gpu, spec, DL, a, acts);
  const std::vector<float> keep_a = floats(acts.a), keep_qan = floats(acts.qan), keep_kvn = floats(acts.kvn),
                           keep_q = floats(acts.query), keep_k = floats(acts.key), keep_v = floats(acts.value);
  mla_acts_drop_cheap(acts);
  EXPECT_FALSE(acts.query.defined() || acts.a.defined() || acts.kvn.defined());
  mla_acts_restore(e.gpu, spec, DL, x, acts);
  EXPECT_EQ(floats(acts.a), keep_a);
  EXPECT_EQ(floats(acts.qan), keep_qan);
  EXPECT_EQ(floats(acts.kvn), keep_kvn);
  EXPECT_EQ(floats(acts.query), keep_q);
  EXPECT_EQ(floats(acts.key), keep_k);
  EXPECT_EQ(floats(acts.value), keep_v);
}

TEST(CudaMlaBlock, UnsupportedHeadSizesAreNamed) {
  test::MlaGeometry g;
  g.nope = 120, g.rope = 64, g.v = 128;  // qk 184: no kernel
  const AttentionSpec a = DecoderSpec::from_json(test::dsv3_test_json(g, 1, 1), "t").attention.at(0);
  const std::string why = mla_cuda_unsupported_reason(a);
  EXPECT_NE(why.find("184"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  EXPECT_EQ(mla_value_pad(a), 0);
}

}  // namespace
}  // namespace mt
