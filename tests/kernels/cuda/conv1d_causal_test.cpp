// CUDA Mamba2 causal conv1d + bias + SiLU (kernels/cuda/conv1d_causal.h) against the CPU: cpu::conv1d_causal_* with
// the CPU block's silu loops around them (layers/mamba2_mixer_block.cpp), over packed documents (several per row, one
// of length 1, two batch rows), with the conv's input read from columns of a wider proj and dx written into columns
// of a wider dproj whose other columns must stay untouched.
//
// Tolerances (max-norm = max|Δ| / max|ref|, rel-L2 as cuda_test_util.h):
// - conv: both sides sum the taps in the same order without FMA, bias last, so conv's fp32 bits agree; silu's expf
//   (CUDA, ≤ 2 ulp) vs glibc's exp differ by a few fp32 ulps. F32 act: 2e-6 / 1e-6. BF16 act: conv rounds to the
//   same bf16, silu's few-ulp difference can flip the final bf16 rounding of an element (rarely: the fp32 value
//   must sit within a few ulps of a rounding midpoint); a flip moves it one bf16 step, ≤ 2^-7 of the element
//   (at the bottom of a binade), so ≤ 7.8e-3 of max|ref|: 8e-3 / 1e-3.
// - dx: dconv = dact·silu'(conv) differs by a few fp32 ulps (expf, FMA contraction in silu'), the tap sums are the
//   same fp32 ops. F32: 1e-5 / 2e-6. BF16: the device rounds dx once to bf16 (half a step: ≤ 2^-8 = 3.9e-3 of the
//   element at the bottom of a binade, ~1.6e-3 rms; the CPU stays fp32): 4e-3 / 3e-3.
// - dw, db: the CPU sums in double in token order, the device in fp32 (per-thread runs of 16, 8 runs, ≤ 64 parts,
//   32 strides): fp32 summation error of ≲ 1e-6 of the sum's scale over ≤ 16384 terms: 1e-4 / 2e-5 (both dtypes:
//   the inputs are the same bf16 values).
// Bit-reproducibility: dw and db from two runs are compared bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "kernels/cpu/conv1d_causal.h"
#include "kernels/cuda/conv1d_causal.h"
#include "kernels/cuda/device_context.h"
#include "mamba2_test_util.h"

namespace mt {
namespace {

float silu_ref(float x) { return x / (1.0f + std::exp(-x)); }

struct ConvCase {
  std::vector<std::vector<int64_t>> docs;  // per batch row
  int64_t seq = 0, C = 0, K = 4;
  int64_t W = 0, col0 = 0;    // proj [T, W], the conv's input at columns [col0, col0 + C)
  int64_t dW = 0, dcol0 = 0;  // dproj [T, dW], dx at [dcol0, dcol0 + C)
  bool bias = true, frozen_w = false, frozen_b = false;
  DType dt = DType::BF16;
  DType param_dt = DType::BF16;
  uint64_t seed = 1;
};

std::string name_of(const ConvCase& c) {
  return std::string(c.dt == DType::BF16 ? "bf16" : "f32") + " T=" + std::to_string(c.docs.size() * c.seq) +
         " C=" + std::to_string(c.C) + " K=" + std::to_string(c.K) + " W=" + std::to_string(c.W) + " col0=" +
         std::to_string(c.col0) + (c.bias ? "" : " no-bias") + (c.frozen_w ? " frozen-w" : "") +
         (c.frozen_b ? " frozen-b" : "");
}

void run_case(const ConvCase& c) {
  const bool bf = c.dt == DType::BF16;
  const std::string what = name_of(c);
  auto& ctx = cuda::device_context(0);
  const test::PackedDocs docs = test::packed_docs(c.docs, c.seq);
  const int64_t T = docs.batch * c.seq, C = c.C, K = c.K;

  // Inputs (bf16-representable in BF16 so both sides see the same numbers).
  const Tensor proj = test::host_random({T, c.W}, c.seed, 1.0f, bf);
  const Tensor w = test::host_random({C, 1, K}, c.seed + 1, 0.5f, true).to(c.param_dt);
  const Tensor b = c.bias ? test::host_random({C}, c.seed + 2, 0.5f, true).to(c.param_dt) : Tensor();
  const Tensor dact = test::host_random({T, C}, c.seed + 3, 1.0f, bf);
  const Tensor dw0 = test::host_random({C, 1, K}, c.seed + 4, 0.1f);  // accumulated into
  const Tensor db0 = test::host_random({C}, c.seed + 5, 0.1f);
  const Tensor dproj0 = test::host_random({T, c.dW}, c.seed + 6, 1.0f, bf);

  // CPU: the block's forward (conv, then silu rounded in bf16) and backward (silu', then the conv's backward).
  const std::vector<float> projv = proj.to_floats();
  const Tensor xbc = test::host_columns(projv, T, c.W, c.col0, C);
  const Tensor conv = cpu::conv1d_causal_forward(xbc, w, b, docs.segs, bf);
  std::vector<float> act_ref = conv.to_floats();
  for (float& a : act_ref) a = bf ? round_bf16(silu_ref(a)) : silu_ref(a);
  std::vector<float> dconv = dact.to_floats();
  {
    const std::vector<float> cv = conv.to_floats();
    for (size_t i = 0; i < dconv.size(); ++i) {
      const float sig = 1.0f / (1.0f + std::exp(-cv[i]));
      dconv[i] *= sig * (1.0f + cv[i] * (1.0f - sig));
    }
  }
  Tensor dw_ref = dw0.clone(), db_ref = db0.clone();
  const Tensor dx_ref = cpu::conv1d_causal_backward(Tensor::from_floats({T, C}, dconv), xbc, w, docs.segs,
                                                    c.frozen_w ? nullptr : &dw_ref,
                                                    c.frozen_b || !c.bias ? nullptr : &db_ref);

  // Device forward.
  const Tensor dproj_dev_in = test::device_from_host(proj, c.dt);
  const Tensor dw_dev = cuda::to_device(w, 0);
  const Tensor db_dev = c.bias ? cuda::to_device(b, 0) : Tensor();
  Tensor act = Tensor::empty({T, C}, c.dt, Device::cuda(0));
  cuda::conv1d_causal_silu_forward(dproj_dev_in, c.col0, dw_dev, db_dev, docs.dev, act, ctx.stream);
  test::expect_near_normalised(test::device_floats(act), act_ref, bf ? 8e-3 : 2e-6, bf ? 1e-3 : 1e-6,
                               what + " act");

  // Device backward, twice (bit-reproducible parameter gradients).
  const Tensor ddact = test::device_from_host(dact, c.dt);
  std::vector<float> dw_runs[2], db_runs[2], dproj_out;
  for (int run = 0; run < 2; ++run) {
    Tensor dproj = test::device_from_host(dproj0, c.dt);
    Tensor gw = c.frozen_w ? Tensor() : cuda::to_device(dw0, 0);
    Tensor gb = (c.frozen_b || !c.bias) ? Tensor() : cuda::to_device(db0, 0);
    cuda::conv1d_causal_silu_backward(ddact, dproj_dev_in, c.col0, dw_dev, db_dev, docs.dev, dproj, c.dcol0, gw, gb,
                                      ctx.stream);
    if (gw.defined()) dw_runs[run] = test::device_floats(gw);
    if (gb.defined()) db_runs[run] = test::device_floats(gb);
    if (run == 0) dproj_out = test::device_floats(dproj);
  }
  test::expect_near_normalised(test::columns_of(dproj_out, T, c.dW, c.dcol0, C), dx_ref.to_floats(),
                               bf ? 4e-3 : 1e-5, bf ? 3e-3 : 2e-6, what + " dx");
  test::expect_other_columns_untouched(dproj_out, dproj0.to_floats(), T, c.dW, c.dcol0, C, what + " dproj");
  if (!c.frozen_w) {
    test::expect_near_normalised(dw_runs[0], dw_ref.to_floats(), 1e-4, 2e-5, what + " dw");
    test::expect_bitwise_equal(dw_runs[0], dw_runs[1], what + " dw run to run");
  }
  if (!c.frozen_b && c.bias) {
    test::expect_near_normalised(db_runs[0], db_ref.to_floats(), 1e-4, 2e-5, what + " db");
    test::expect_bitwise_equal(db_runs[0], db_runs[1], what + " db run to run");
  }
}

// Two rows of packed documents (one of length 1 in each row, one starting at the row's first token), several
// widths, offsets that break and keep the vector paths, and every K.
TEST(CudaConv1dCausal, MatchesCpuPackedDocs) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 4100;
  for (DType dt : {DType::BF16, DType::F32}) {
    for (int64_t K = 1; K <= 4; ++K) {
      ConvCase c;
      c.docs = {{5, 1, 7, 3}, {1, 15}};
      c.seq = 16, c.C = 10, c.K = K, c.W = 23, c.col0 = 5, c.dW = 17, c.dcol0 = 3;  // scalar path: C % 4 != 0
      c.dt = dt, c.param_dt = dt, c.seed = seed += 10;
      run_case(c);
      c.C = 64, c.W = 96, c.col0 = 24, c.dW = 80, c.dcol0 = 8;  // vector path (V = 8 / 4)
      c.seed = seed += 10;
      run_case(c);
    }
    ConvCase c;  // more than one run (16 tokens) and block (128 tokens) per document, a document over a run boundary
    c.docs = {{1, 130, 69}, {200}};
    c.seq = 200, c.C = 40, c.K = 4, c.W = 48, c.col0 = 8, c.dW = 40, c.dcol0 = 0;
    c.dt = dt, c.param_dt = dt, c.seed = seed += 10;
    run_case(c);
  }
}

// F32 parameters under a BF16 activation (a master-weight caller), no bias, frozen gradients.
TEST(CudaConv1dCausal, ParamsAndFrozenGradients) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 4300;
  for (DType dt : {DType::BF16, DType::F32}) {
    ConvCase c;
    c.docs = {{3, 1, 28}, {32}};
    c.seq = 32, c.C = 24, c.K = 4, c.W = 40, c.col0 = 8, c.dW = 32, c.dcol0 = 8;
    c.dt = dt, c.param_dt = DType::F32;
    c.seed = seed += 10;
    run_case(c);
    c.bias = false, c.seed = seed += 10;
    run_case(c);
    c.bias = true, c.frozen_w = true, c.seed = seed += 10;
    run_case(c);
    c.frozen_w = false, c.frozen_b = true, c.seed = seed += 10;
    run_case(c);
    c.frozen_w = true, c.seed = seed += 10;
    run_case(c);
  }
}

// Over 64 blocks of 128 tokens: the backward's parts take several blocks' runs each (rows_per_part > 128).
TEST(CudaConv1dCausal, ManyTokens) {
  MT_SKIP_WITHOUT_CUDA();
  ConvCase c;
  c.docs = {{1, 4000, 4999}, {9000}};
  c.seq = 9000, c.C = 16, c.K = 4, c.W = 32, c.col0 = 16, c.dW = 16, c.dcol0 = 0;
  c.seed = 4500;
  run_case(c);
}

// Nemotron 3 Nano's conv: C = 6144, K = 4, xBC at columns [4096, 10240) of in_proj's 10304.
TEST(CudaConv1dCausal, NemotronNanoShape) {
  MT_SKIP_WITHOUT_CUDA();
  ConvCase c;
  c.docs = {{1, 1000, 3095}};
  c.seq = 4096, c.C = 6144, c.K = 4, c.W = 10304, c.col0 = 4096, c.dW = 10304, c.dcol0 = 4096;
  c.seed = 4600;
  run_case(c);
}

TEST(CudaConv1dCausal, ZeroTokensAndBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  const Tensor w = Tensor::empty({8, 1, 4}, DType::BF16, d), b = Tensor::empty({8}, DType::BF16, d);
  cuda::AttentionDocs none{Tensor::empty({0}, DType::I32, d), Tensor::empty({0}, DType::I32, d)};
  Tensor proj0 = Tensor::empty({0, 16}, DType::BF16, d), act0 = Tensor::empty({0, 8}, DType::BF16, d);
  cuda::conv1d_causal_silu_forward(proj0, 4, w, b, none, act0, ctx.stream);  // T = 0: nothing to do
  Tensor dw = Tensor::empty({8, 1, 4}, DType::F32, d), db = Tensor::empty({8}, DType::F32, d);
  Tensor dproj0 = Tensor::empty({0, 16}, DType::BF16, d);
  cuda::conv1d_causal_silu_backward(act0, proj0, 4, w, b, none, dproj0, 0, dw, db, ctx.stream);

  const test::PackedDocs docs = test::packed_docs({{4}}, 4);
  Tensor proj = Tensor::empty({4, 16}, DType::BF16, d), act = Tensor::empty({4, 8}, DType::BF16, d);
  EXPECT_THROW(cuda::conv1d_causal_silu_forward(proj, 9, w, b, docs.dev, act, ctx.stream), Error);  // past W
  Tensor act_f32 = Tensor::empty({4, 8}, DType::F32, d);
  EXPECT_THROW(cuda::conv1d_causal_silu_forward(proj, 0, w, b, docs.dev, act_f32, ctx.stream), Error);
  const Tensor w5 = Tensor::empty({8, 1, 5}, DType::BF16, d);
  EXPECT_THROW(cuda::conv1d_causal_silu_forward(proj, 0, w5, b, docs.dev, act, ctx.stream), Error);  // K > 4
  Tensor dproj_narrow = Tensor::empty({4, 8}, DType::BF16, d);
  EXPECT_THROW(cuda::conv1d_causal_silu_backward(act, proj, 0, w, b, docs.dev, dproj_narrow, 1, dw, db, ctx.stream),
               Error);
  Tensor dproj = Tensor::empty({4, 16}, DType::BF16, d);
  EXPECT_THROW(cuda::conv1d_causal_silu_backward(act, proj, 0, w, Tensor(), docs.dev, dproj, 0, dw, db, ctx.stream),
               Error);  // a bias gradient without a bias
}

}  // namespace
}  // namespace mt
