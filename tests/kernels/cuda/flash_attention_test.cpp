// CUDA flash attention (forward + backward) against cpu::attention_forward / attention_backward in bf16
// mode: causal GQA over packed documents, odd sequence lengths, many short documents, one long document,
// head_dim 16, 32, 64, 128 and 256 (each has its own tile sizes; 16 and 32 their own shared-memory
// swizzle, 256 a backward split into two column slices: flash_attention_tiles.cuh).
//
// Thresholds: both sides take the same bf16 inputs and compute scores and softmax in fp32. The CPU rounds
// the normalised P to bf16 before P·V; the GPU rounds the unnormalised exp (FlashAttention's order) and
// normalises after, then rounds the output once: outputs agree to about one bf16 rounding (max-norm 1e-2,
// rel-L2 5e-3). The log-sum-exp is fp32 on both sides: 1e-4 absolute. The backward multiplies bf16 P
// and bf16 dS on tensor cores where the CPU keeps dS in fp32, and its outputs are bf16: max-norm 2e-2,
// rel-L2 1e-2. A masking or indexing error gives O(1) errors. Measured on an H200: out up to 5.6e-3 / 2.8e-3,
// lse 1e-6, gradients up to 5.1e-3 / 2.8e-3 (head_dim 64/128; 16, 32, 256: out up to 6.4e-3 / 2.9e-3,
// gradients up to 6.2e-3 / 3.4e-3). On a cc 9.0 GPU the head_dim 128 cases run the Hopper forward and
// backward (flash_attention_{fwd,bwd}_sm90.cu); Sm90AndMmaSync{Forwards,Backwards}AgreeD128 run both
// head_dim 128 kernels of each pass.
//
// Sliding window, sinks and a given scale (GPT-OSS, the CudaFlashAttentionWindowSinks suite): the window only
// masks (a visible element is computed exactly as without it) and the sink adds one fp32 term exp2(sink − m) to
// each row sum, so the rounding points and the thresholds above are unchanged: out 1e-2 / 5e-3, lse 1e-4,
// dq/dk/dv 2e-2 / 1e-2 (max-norm relative to the whole tensor: a head whose sink takes most of the weight has
// small outputs, but ignoring its sink, or a key leaking in from outside the window, is an O(1) error there).
// dsinks[h] = −Σ_t p_sink·delta_t: p_sink comes from the fp32 lse (1e-4 absolute: 1e-4 relative), delta from the
// bf16 output (Σ_d dO·O with O off by ~one bf16 rounding, rel-L2 ~3e-3 measured) where the CPU sums Σ_j P·dP in
// double from unrounded P; the errors of the T terms have random signs as the terms do, so the sum keeps about
// the relative error of O: the gradient thresholds (2e-2 / 1e-2 over the heads) leave a 5x margin; a sign error
// or a missing term is O(1). With window 1 and no sink every row's softmax is the constant 1: dS = 0 and the CPU
// dq, dk are exactly 0; the GPU leaves fp32 rounding noise (dP − delta summed in two orders, ~1e-6): 1e-4
// absolute there. The deterministic backward and dsinks repeat bitwise (memcmp) in both modes.
// The Hopper forward at head_dim 64 (window, sinks, scale) against the CPU and the mma.sync forward: the Sm90HeadDim64*
// tests, thresholds derived above them.
#include "kernels/cuda/flash_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"

namespace mt {
namespace {

cudaStream_t stream0() { return cuda::device_context(0).stream; }

struct AttnCase {
  int B, S, Hq, Hk, D;
  int min_doc, max_doc;  // document lengths drawn uniformly; 0 = no doc ids (one causal sequence per row)
};

std::vector<int32_t> make_docs(const AttnCase& c, uint64_t seed) {
  std::vector<int32_t> doc;
  if (c.min_doc == 0) return doc;
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> len(c.min_doc, c.max_doc);
  doc.resize(static_cast<size_t>(c.B) * c.S);
  int id = 0;
  for (int b = 0; b < c.B; ++b)
    for (int i = 0; i < c.S;) {
      const int n = std::min(len(g), c.S - i);
      for (int j = 0; j < n; ++j) doc[b * c.S + i + j] = id;
      i += n, ++id;
    }
  return doc;
}

Tensor host_i32(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(s, DType::I32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

std::vector<int32_t> host_ints(const Tensor& dev) {
  Tensor h = cuda::to_host(dev);
  return {h.data_as<int32_t>(), h.data_as<int32_t>() + h.numel()};
}

// Largest |a − b| between the GPU lse [Hq, B·S] and the CPU one [B, Hq, S].
double lse_max_abs(const AttnCase& c, const std::vector<float>& gpu, const std::vector<float>& cpu) {
  const int T = c.B * c.S;
  double worst = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.S; ++i)
        worst = std::max(worst, std::fabs(double(gpu[static_cast<size_t>(h) * T + b * c.S + i]) -
                                          cpu[(static_cast<size_t>(b) * c.Hq + h) * c.S + i]));
  return worst;
}

void check_case(const AttnCase& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "B " << c.B << " S " << c.S << " Hq " << c.Hq << " Hk " << c.Hk << " D " << c.D
                                  << " docs " << c.min_doc << ".." << c.max_doc);
  const int T = c.B * c.S;
  const std::vector<int32_t> doc = make_docs(c, seed);
  Tensor q = test::host_random({c.B, c.S, c.Hq, c.D}, seed + 1, 1.0f, true);
  Tensor k = test::host_random({c.B, c.S, c.Hk, c.D}, seed + 2, 1.0f, true);
  Tensor v = test::host_random({c.B, c.S, c.Hk, c.D}, seed + 3, 1.0f, true);
  Tensor dout = test::host_random({c.B, c.S, c.Hq, c.D}, seed + 4, 1.0f, true);
  Tensor doc_h = doc.empty() ? Tensor() : host_i32({c.B, c.S}, doc);

  const cpu::AttentionShape cs{c.B, c.S, c.Hq, c.Hk, c.D};
  Tensor want_lse;
  Tensor want = cpu::attention_forward(cs, q, k, v, doc_h, true, want_lse);
  Tensor want_dq, want_dk, want_dv;
  cpu::attention_backward(cs, dout, q, k, v, doc_h, want_lse, true, want_dq, want_dk, want_dv);

  cuda::AttentionDocs docs =
      cuda::attention_docs_from_ids(doc_h.defined() ? cuda::to_device(doc_h, 0) : Tensor(), c.B, c.S, 0, stream0());
  const cuda::FlashAttentionShape fs{T, c.Hq, c.Hk, c.D};
  Tensor qd = test::device_from_host(q, DType::BF16), kd = test::device_from_host(k, DType::BF16),
         vd = test::device_from_host(v, DType::BF16);
  Tensor out, lse;
  cuda::flash_attention_forward(fs, qd, kd, vd, docs, out, lse, stream0());
  EXPECT_EQ(out.shape(), q.shape());
  test::expect_norm(test::device_floats(out), want.to_floats(), 1e-2, 5e-3, "attention out");

  const double worst = lse_max_abs(c, test::device_floats(lse), want_lse.to_floats());
  EXPECT_LE(worst, 1e-4) << "lse";
  if (std::getenv("MT_PRINT_ERRORS")) std::printf("[ error    ] lse: max abs %.3g (limit 1e-4)\n", worst);

  Tensor dq, dk, dv;
  cuda::flash_attention_backward(fs, test::device_from_host(dout, DType::BF16), qd, kd, vd, out, lse, docs, dq, dk, dv,
                                 stream0());
  test::expect_norm(test::device_floats(dq), want_dq.to_floats(), 2e-2, 1e-2, "dq");
  test::expect_norm(test::device_floats(dk), want_dk.to_floats(), 2e-2, 1e-2, "dk");
  test::expect_norm(test::device_floats(dv), want_dv.to_floats(), 2e-2, 1e-2, "dv");
}

// A process-wide kernel setting for one scope: Set(value) now, Set(Reset) at its end.
template <typename T, void (*Set)(T), T Reset>
struct SettingScope {
  explicit SettingScope(T value) { Set(value); }
  ~SettingScope() { Set(Reset); }
  SettingScope(const SettingScope&) = delete;
  SettingScope& operator=(const SettingScope&) = delete;
};
// Which forward / backward kernel runs (back to Auto at exit).
using FwdKernelScope = SettingScope<cuda::detail::FlashFwdKernel, cuda::detail::flash_fwd_kernel_set,
                                    cuda::detail::FlashFwdKernel::Auto>;
using BwdKernelScope = SettingScope<cuda::detail::FlashBwdKernel, cuda::detail::flash_bwd_kernel_set,
                                    cuda::detail::FlashBwdKernel::Auto>;
// The sm90 forward's softmax pinned before the P·V wait (1) or not (0); the sm90 backward's query heads per item
// (back to unset at exit).
using FwdEarlyScope = SettingScope<int, cuda::detail::flash_fwd_sm90_early_softmax_set, -1>;
using BwdHeadsScope = SettingScope<int, cuda::detail::flash_bwd_sm90_heads_set, -1>;

// Whether device 0 runs the Hopper forward (head_dim 128, cc 9.0, sm_90a build).
bool sm90_forward_runs() {
  (void)stream0();  // makes device 0 current
  cuda::detail::FlashArgs a;
  a.T = 128, a.Hq = 1, a.Hk = 1, a.D = 128;
  return cuda::detail::flash_fwd_sm90_supported(a);
}

struct FwdOut {
  std::vector<float> out, lse;
};

// One forward with the given kernel on inputs drawn from `seed` (the same inputs for the same case and seed).
FwdOut forward_with(cuda::detail::FlashFwdKernel kind, const AttnCase& c, uint64_t seed) {
  const std::vector<int32_t> doc = make_docs(c, seed);
  const Tensor doc_h = doc.empty() ? Tensor() : host_i32({c.B, c.S}, doc);
  cuda::AttentionDocs docs =
      cuda::attention_docs_from_ids(doc_h.defined() ? cuda::to_device(doc_h, 0) : Tensor(), c.B, c.S, 0, stream0());
  const Tensor q = test::device_from_host(test::host_random({c.B, c.S, c.Hq, c.D}, seed + 1, 1.0f, true), DType::BF16);
  const Tensor k = test::device_from_host(test::host_random({c.B, c.S, c.Hk, c.D}, seed + 2, 1.0f, true), DType::BF16);
  const Tensor v = test::device_from_host(test::host_random({c.B, c.S, c.Hk, c.D}, seed + 3, 1.0f, true), DType::BF16);
  FwdKernelScope scope(kind);
  Tensor out, lse;
  cuda::flash_attention_forward({int64_t{c.B} * c.S, c.Hq, c.Hk, c.D}, q, k, v, docs, out, lse, stream0());
  return {test::device_floats(out), test::device_floats(lse)};
}

// head_dim 128 has two forwards: the Hopper one (TMA + wgmma, 128 x 128 tiles; Auto on a cc 9.0 GPU) and
// the mma.sync one (128 x 64 tiles; every other GPU, or MIXTUNE_FLASH_FWD=mma). Both against the CPU on
// small cases, then against each other at the benchmark's size (seq 4096, 32 / 4 heads: the CPU
// reference would take minutes there): one causal sequence, packed documents of 1..1500 tokens (document
// starts inside 128-row query tiles and inside key tiles), and two batch rows with T = 3974 (not a
// multiple of 128: a partial last query tile and key tiles running past T). Different tile widths give
// different running maxima where P is rounded to bf16, so the outputs differ by about one bf16 rounding
// (max-norm 1e-2, rel-L2 5e-3); the lse is fp32 on both: 1e-3 absolute.
TEST(CudaFlashAttention, Sm90AndMmaSyncForwardsAgreeD128) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_forward_runs())
    GTEST_SKIP() << "the sm90 flash-attention forward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  using K = cuda::detail::FlashFwdKernel;
  for (const AttnCase& c : {AttnCase{2, 300, 8, 2, 128, 1, 150}, AttnCase{1, 700, 4, 1, 128, 0, 0}}) {
    SCOPED_TRACE(testing::Message() << "vs CPU: B " << c.B << " S " << c.S << " Hq " << c.Hq << " Hk " << c.Hk
                                    << " docs " << c.min_doc << ".." << c.max_doc);
    const uint64_t seed = 80 + c.S;
    const std::vector<int32_t> doc = make_docs(c, seed);
    Tensor want_lse;
    const Tensor want = cpu::attention_forward(
        {c.B, c.S, c.Hq, c.Hk, c.D}, test::host_random({c.B, c.S, c.Hq, c.D}, seed + 1, 1.0f, true),
        test::host_random({c.B, c.S, c.Hk, c.D}, seed + 2, 1.0f, true),
        test::host_random({c.B, c.S, c.Hk, c.D}, seed + 3, 1.0f, true),
        doc.empty() ? Tensor() : host_i32({c.B, c.S}, doc), true, want_lse);
    for (const K kind : {K::Sm90, K::MmaSync}) {
      const std::string name = kind == K::Sm90 ? "sm90" : "mma";
      const FwdOut got = forward_with(kind, c, seed);
      test::expect_norm(got.out, want.to_floats(), 1e-2, 5e-3, name + " out");
      const double worst = lse_max_abs(c, got.lse, want_lse.to_floats());
      EXPECT_LE(worst, 1e-4) << name << " lse";
    }
  }
  for (const AttnCase& c : {AttnCase{1, 4096, 32, 4, 128, 0, 0}, AttnCase{1, 4096, 32, 4, 128, 1, 1500},
                            AttnCase{2, 1987, 32, 4, 128, 1, 700}}) {
    SCOPED_TRACE(testing::Message() << "sm90 vs mma: B " << c.B << " S " << c.S << " docs " << c.min_doc << ".."
                                    << c.max_doc);
    const uint64_t seed = 90 + c.S + c.max_doc;
    const FwdOut a = forward_with(K::Sm90, c, seed), b = forward_with(K::MmaSync, c, seed);
    test::expect_norm(a.out, b.out, 1e-2, 5e-3, "sm90 vs mma out");
    ASSERT_EQ(a.lse.size(), b.lse.size());
    double worst = 0;
    size_t non_finite = 0;
    for (size_t i = 0; i < a.lse.size(); ++i) {
      if (!std::isfinite(a.lse[i]) || !std::isfinite(b.lse[i]))
        ++non_finite;
      else
        worst = std::max(worst, std::fabs(double(a.lse[i]) - b.lse[i]));
    }
    EXPECT_EQ(non_finite, 0u) << "lse: every row sees at least itself";
    EXPECT_LE(worst, 1e-3) << "sm90 vs mma lse";
    if (std::getenv("MT_PRINT_ERRORS")) std::printf("[ error    ] sm90 vs mma lse: max abs %.3g (limit 1e-3)\n", worst);
  }
}

// Pinning the softmax before the wait for P·V changes only when the instructions run, not what they compute:
// out and lse bit for bit the same as the unpinned loop (packed documents, MQA, partial tiles, the bench's size).
// A softmax that read S before its MMA completed, or wrote P while P·V still read it, would differ.
TEST(CudaFlashAttention, Sm90ForwardEarlySoftmaxIsBitwiseTheSame) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_forward_runs())
    GTEST_SKIP() << "the sm90 flash-attention forward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  for (const AttnCase& c : {AttnCase{2, 1300, 8, 2, 128, 1, 700}, AttnCase{1, 1500, 4, 1, 128, 0, 0},
                            AttnCase{1, 4096, 32, 4, 128, 1, 1500}}) {
    SCOPED_TRACE(testing::Message() << "B " << c.B << " S " << c.S << " Hq " << c.Hq << " Hk " << c.Hk << " docs "
                                    << c.min_doc << ".." << c.max_doc);
    FwdOut late, early;
    {
      FwdEarlyScope scope(0);
      late = forward_with(cuda::detail::FlashFwdKernel::Sm90, c, 950 + c.S);
    }
    {
      FwdEarlyScope scope(1);
      early = forward_with(cuda::detail::FlashFwdKernel::Sm90, c, 950 + c.S);
    }
    ASSERT_EQ(late.out.size(), early.out.size());
    size_t out_diff = 0, lse_diff = 0;
    for (size_t i = 0; i < late.out.size(); ++i) out_diff += late.out[i] != early.out[i];
    for (size_t i = 0; i < late.lse.size(); ++i) lse_diff += !(late.lse[i] == early.lse[i]);
    EXPECT_EQ(out_diff, 0u) << "out elements that differ";
    EXPECT_EQ(lse_diff, 0u) << "lse elements that differ";
  }
}

// Whether device 0 runs the Hopper backward (head_dim 128, cc 9.0, sm_90a build).
bool sm90_backward_runs() {
  (void)stream0();
  cuda::detail::FlashArgs a;
  a.T = 128, a.Hq = 1, a.Hk = 1, a.D = 128;
  return cuda::detail::flash_bwd_sm90_supported(a);
}

// Device inputs of one case (drawn from `seed` as in check_case) with the forward's out and lse (the
// default forward), for running the backward with either kernel on the same data.
struct BwdInputs {
  cuda::AttentionDocs docs;
  Tensor q, k, v, dout, out, lse;
};

BwdInputs bwd_inputs(const AttnCase& c, uint64_t seed) {
  const std::vector<int32_t> doc = make_docs(c, seed);
  const Tensor doc_h = doc.empty() ? Tensor() : host_i32({c.B, c.S}, doc);
  BwdInputs in;
  in.docs = cuda::attention_docs_from_ids(doc_h.defined() ? cuda::to_device(doc_h, 0) : Tensor(), c.B, c.S, 0,
                                          stream0());
  in.q = test::device_from_host(test::host_random({c.B, c.S, c.Hq, c.D}, seed + 1, 1.0f, true), DType::BF16);
  in.k = test::device_from_host(test::host_random({c.B, c.S, c.Hk, c.D}, seed + 2, 1.0f, true), DType::BF16);
  in.v = test::device_from_host(test::host_random({c.B, c.S, c.Hk, c.D}, seed + 3, 1.0f, true), DType::BF16);
  in.dout = test::device_from_host(test::host_random({c.B, c.S, c.Hq, c.D}, seed + 4, 1.0f, true), DType::BF16);
  cuda::flash_attention_forward({int64_t{c.B} * c.S, c.Hq, c.Hk, c.D}, in.q, in.k, in.v, in.docs, in.out, in.lse,
                                stream0());
  return in;
}

struct BwdOut {
  std::vector<float> dq, dk, dv;
};

BwdOut backward_with(cuda::detail::FlashBwdKernel kind, const AttnCase& c, const BwdInputs& in) {
  BwdKernelScope scope(kind);
  Tensor dq, dk, dv;
  cuda::flash_attention_backward({int64_t{c.B} * c.S, c.Hq, c.Hk, c.D}, in.dout, in.q, in.k, in.v, in.out, in.lse,
                                 in.docs, dq, dk, dv, stream0());
  return {test::device_floats(dq), test::device_floats(dk), test::device_floats(dv)};
}

// The CPU backward of the case drawn from `seed` (the inputs bwd_inputs makes): the reference gradients.
BwdOut cpu_backward(const AttnCase& c, uint64_t seed) {
  const std::vector<int32_t> doc = make_docs(c, seed);
  const Tensor doc_h = doc.empty() ? Tensor() : host_i32({c.B, c.S}, doc);
  const cpu::AttentionShape cs{c.B, c.S, c.Hq, c.Hk, c.D};
  const Tensor q = test::host_random({c.B, c.S, c.Hq, c.D}, seed + 1, 1.0f, true);
  const Tensor k = test::host_random({c.B, c.S, c.Hk, c.D}, seed + 2, 1.0f, true);
  const Tensor v = test::host_random({c.B, c.S, c.Hk, c.D}, seed + 3, 1.0f, true);
  const Tensor dout = test::host_random({c.B, c.S, c.Hq, c.D}, seed + 4, 1.0f, true);
  Tensor lse, dq, dk, dv;
  (void)cpu::attention_forward(cs, q, k, v, doc_h, true, lse);
  cpu::attention_backward(cs, dout, q, k, v, doc_h, lse, true, dq, dk, dv);
  return {dq.to_floats(), dk.to_floats(), dv.to_floats()};
}

// dq, dk, dv within the CPU tolerance of the file's header (max-norm 2e-2, rel-L2 1e-2).
void expect_grads_near(const BwdOut& got, const BwdOut& want, const std::string& name) {
  test::expect_norm(got.dq, want.dq, 2e-2, 1e-2, name + " dq");
  test::expect_norm(got.dk, want.dk, 2e-2, 1e-2, name + " dk");
  test::expect_norm(got.dv, want.dv, 2e-2, 1e-2, name + " dv");
}

// head_dim 128 has two backwards: the Hopper one (TMA + wgmma, 128-key blocks walking 64-query steps, dQ
// through bulk reduce-adds; Auto on a cc 9.0 GPU) and the mma.sync one (every other GPU, or
// MIXTUNE_FLASH_BWD=mma). Both against the CPU on small cases (packed documents of odd lengths, T not a
// multiple of 128 or 64, GQA 4:1 and MQA, no GQA), then against each other at the benchmark's size (the
// CPU would take minutes there): one causal sequence of 4096, packed documents of 1..1500 tokens, and two
// batch rows with T = 3974. Both round P and dS to bf16 for the tensor cores and differ in fp32 summation order
// only (the sm90 one forms dS from the bf16-rounded P), so they agree well inside the CPU tolerance
// (max-norm 2e-2, rel-L2 1e-2). Measured on an H200: sm90 vs CPU up to 5.2e-3 / 3.2e-3 (mma.sync 4.8e-3 /
// 2.8e-3), sm90 vs mma.sync up to 8e-3 / 3.6e-3 (dq, dk) and 4.4e-4 / 1.7e-5 (dv).
TEST(CudaFlashAttention, Sm90AndMmaSyncBackwardsAgreeD128) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_backward_runs())
    GTEST_SKIP() << "the sm90 flash-attention backward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  using K = cuda::detail::FlashBwdKernel;
  for (const AttnCase& c : {AttnCase{2, 300, 8, 2, 128, 1, 150}, AttnCase{1, 700, 4, 1, 128, 0, 0},
                            AttnCase{3, 171, 4, 4, 128, 1, 45}, AttnCase{1, 67, 2, 1, 128, 0, 0}}) {
    SCOPED_TRACE(testing::Message() << "vs CPU: B " << c.B << " S " << c.S << " Hq " << c.Hq << " Hk " << c.Hk
                                    << " docs " << c.min_doc << ".." << c.max_doc);
    const uint64_t seed = 180 + c.S;
    const BwdOut want = cpu_backward(c, seed);
    const BwdInputs in = bwd_inputs(c, seed);
    for (const K kind : {K::Sm90, K::MmaSync}) {
      const std::string name = kind == K::Sm90 ? "sm90" : "mma";
      expect_grads_near(backward_with(kind, c, in), want, name);
    }
  }
  for (const AttnCase& c : {AttnCase{1, 4096, 32, 4, 128, 0, 0}, AttnCase{1, 4096, 32, 4, 128, 1, 1500},
                            AttnCase{2, 1987, 32, 4, 128, 1, 700}}) {
    SCOPED_TRACE(testing::Message() << "sm90 vs mma: B " << c.B << " S " << c.S << " docs " << c.min_doc << ".."
                                    << c.max_doc);
    const BwdInputs in = bwd_inputs(c, 190 + c.S + c.max_doc);
    const BwdOut a = backward_with(K::Sm90, c, in), b = backward_with(K::MmaSync, c, in);
    test::expect_norm(a.dq, b.dq, 2e-2, 1e-2, "sm90 vs mma dq");
    test::expect_norm(a.dk, b.dk, 2e-2, 1e-2, "sm90 vs mma dk");
    test::expect_norm(a.dv, b.dv, 2e-2, 1e-2, "sm90 vs mma dv");
  }
}

BwdOut deterministic_backward(const AttnCase& c, const BwdInputs& in) {
  Tensor dq, dk, dv;
  cuda::flash_attention_backward({int64_t{c.B} * c.S, c.Hq, c.Hk, c.D}, in.dout, in.q, in.k, in.v, in.out, in.lse,
                                 in.docs, dq, dk, dv, stream0(), nullptr, cuda::FlashBwdMode::deterministic);
  return {test::device_floats(dq), test::device_floats(dk), test::device_floats(dv)};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// FlashBwdMode::deterministic (train.deterministic): the dK/dV pass stores each query head's sums and a
// group sum adds them in head order; dQ comes from its own forward-shaped pass. Against the CPU within the
// file's tolerance (every head_dim, GQA 4:1, 8:1, MQA and none, packed documents of odd lengths), then, at
// the benchmark's shape, bitwise the same over three runs (the fast backward's fp32 atomics are not: it
// is checked to differ, so the repeat check can tell) and equal to the fast one up to fp32 summation order
// (the same bf16 roundings of P and dS; the tolerance of Sm90AndMmaSyncBackwardsAgreeD128).
TEST(CudaFlashAttention, DeterministicBackwardMatchesCpuAndRepeatsBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  for (const AttnCase& c : {AttnCase{2, 300, 8, 2, 128, 1, 150}, AttnCase{1, 700, 4, 1, 64, 0, 0},
                            AttnCase{3, 171, 4, 4, 32, 1, 45}, AttnCase{1, 130, 8, 1, 16, 1, 60},
                            AttnCase{1, 200, 4, 2, 256, 1, 90}, AttnCase{2, 97, 16, 2, 128, 1, 30}}) {
    SCOPED_TRACE(testing::Message() << "vs CPU: B " << c.B << " S " << c.S << " Hq " << c.Hq << " Hk " << c.Hk
                                    << " D " << c.D << " docs " << c.min_doc << ".." << c.max_doc);
    const uint64_t seed = 770 + c.S + c.D;
    expect_grads_near(deterministic_backward(c, bwd_inputs(c, seed)), cpu_backward(c, seed), "deterministic");
  }
  const AttnCase big{1, 4096, 32, 4, 128, 1, 1500};
  const BwdInputs in = bwd_inputs(big, 4242);
  const BwdOut a = deterministic_backward(big, in);
  for (int rep = 0; rep < 2; ++rep) {
    const BwdOut b = deterministic_backward(big, in);
    EXPECT_TRUE(bitwise_equal(a.dq, b.dq)) << "dq differs on repeat " << rep;
    EXPECT_TRUE(bitwise_equal(a.dk, b.dk)) << "dk differs on repeat " << rep;
    EXPECT_TRUE(bitwise_equal(a.dv, b.dv)) << "dv differs on repeat " << rep;
  }
  const BwdOut f1 = backward_with(cuda::detail::FlashBwdKernel::Auto, big, in);
  const BwdOut f2 = backward_with(cuda::detail::FlashBwdKernel::Auto, big, in);
  EXPECT_FALSE(bitwise_equal(f1.dq, f2.dq) && bitwise_equal(f1.dk, f2.dk))
      << "the fast backward repeated bitwise: this check cannot tell a deterministic kernel from a lucky one";
  test::expect_norm(a.dq, f1.dq, 2e-2, 1e-2, "deterministic vs fast dq");
  test::expect_norm(a.dk, f1.dk, 2e-2, 1e-2, "deterministic vs fast dk");
  test::expect_norm(a.dv, f1.dv, 2e-2, 1e-2, "deterministic vs fast dv");
}

// The sm90 backward's items can cover several query heads of one KV head (their dK, dV summed in registers
// before one flush): every G dividing Hq / Hk against the CPU, on GQA 8:1 and 4:1 with packed documents and
// T not a multiple of 64, with items longer than one block's share (one block per item too), then against
// G = 1 at the benchmark's size. A head indexing error (wrong Q, dO, lse or delta head for a step, dK/dV to the
// wrong KV head) gives O(1) errors.
TEST(CudaFlashAttention, Sm90BackwardHeadsPerItemMatchCpu) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_backward_runs())
    GTEST_SKIP() << "the sm90 flash-attention backward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  BwdKernelScope kernel(cuda::detail::FlashBwdKernel::Sm90);
  for (const AttnCase& c : {AttnCase{2, 300, 16, 2, 128, 1, 150}, AttnCase{1, 517, 8, 2, 128, 0, 0},
                            AttnCase{3, 171, 8, 1, 128, 1, 45}}) {
    SCOPED_TRACE(testing::Message() << "B " << c.B << " S " << c.S << " Hq " << c.Hq << " Hk " << c.Hk << " docs "
                                    << c.min_doc << ".." << c.max_doc);
    const uint64_t seed = 700 + c.S;
    const BwdOut want = cpu_backward(c, seed);
    const BwdInputs in = bwd_inputs(c, seed);
    for (int g = 1; g <= c.Hq / c.Hk; g *= 2) {
      BwdHeadsScope heads(g);
      EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(c.B * c.S, c.Hq, c.Hk, 132), g);
      Tensor dq, dk, dv;
      cuda::flash_attention_backward({int64_t{c.B} * c.S, c.Hq, c.Hk, c.D}, in.dout, in.q, in.k, in.v, in.out,
                                     in.lse, in.docs, dq, dk, dv, stream0());
      expect_grads_near({test::device_floats(dq), test::device_floats(dk), test::device_floats(dv)}, want,
                        "G " + std::to_string(g));
    }
  }
  const AttnCase c{1, 4096, 32, 4, 128, 1, 1500};
  const BwdInputs in = bwd_inputs(c, 777);
  BwdOut one;
  {
    BwdHeadsScope heads(1);
    one = backward_with(cuda::detail::FlashBwdKernel::Sm90, c, in);
  }
  for (int g : {2, 4, 8}) {
    BwdHeadsScope heads(g);
    const BwdOut got = backward_with(cuda::detail::FlashBwdKernel::Sm90, c, in);
    const std::string name = "G " + std::to_string(g) + " vs 1";
    // fp32 sums in another order, then bf16: far inside the CPU tolerance (a wrong head is O(1)).
    test::expect_norm(got.dq, one.dq, 1e-2, 2e-3, name + " dq");
    test::expect_norm(got.dk, one.dk, 1e-2, 2e-3, name + " dk");
    test::expect_norm(got.dv, one.dv, 1e-2, 2e-3, name + " dv");
  }
}

// The choice of heads per item (no GPU needed): a forced G is lowered to a divisor of Hq / Hk; the rule takes 2
// where Hq / Hk is even and 2 heads per item still leave two items per SM, else 1.
TEST(CudaFlashAttention, Sm90BackwardHeadsPerItemChoice) {
  {
    BwdHeadsScope heads(3);
    EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(4096, 32, 4, 132), 2);
  }
  {
    BwdHeadsScope heads(16);
    EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(4096, 32, 4, 132), 8);
  }
  BwdHeadsScope choose(0);
  EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(4096, 32, 4, 132), 2);    // 512 items
  EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(131072, 32, 4, 132), 2);
  EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(2048, 32, 4, 132), 1);    // 256 items < 2 x 132
  EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(4096, 4, 4, 132), 1);     // no GQA
  EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(4096, 12, 4, 132), 1);    // Hq / Hk = 3
  EXPECT_EQ(cuda::detail::flash_bwd_sm90_heads_per_item(2048, 32, 4, 64), 2);     // fewer SMs
}

void dq_sums_feed_the_qk_norm_rope_backward(const AttnCase& c) {
  SCOPED_TRACE("S=" + std::to_string(c.S) + " Hq=" + std::to_string(c.Hq));
  const int64_t T = int64_t{c.B} * c.S, rows = T * c.Hq;
  const BwdInputs in = bwd_inputs(c, 640);
  BwdKernelScope scope(cuda::detail::FlashBwdKernel::Sm90);
  Tensor dq, dk, dv;
  cuda::FlashDqSums sums;
  cuda::flash_attention_backward({T, c.Hq, c.Hk, c.D}, in.dout, in.q, in.k, in.v, in.out, in.lse, in.docs, dq, dk, dv,
                                 stream0(), &sums);
  ASSERT_TRUE(sums.acc.defined());
  EXPECT_FALSE(dq.defined()) << "dq is left to the sums' reader";
  EXPECT_EQ(sums.tokens, T);
  EXPECT_EQ(sums.heads, c.Hq);
  EXPECT_FLOAT_EQ(sums.scale, 1.0f / std::sqrt(128.0f));
  Tensor dq_bf16 = Tensor::empty({rows, c.D}, DType::BF16, Device::cuda(0));
  cuda::flash_dq_sums_to_bf16(sums, dq_bf16, stream0());

  std::vector<int64_t> pos_v;
  for (int64_t t = 0; t < T; ++t) pos_v.push_back(t % 97);
  Tensor pos = Tensor::empty({T}, DType::I64);
  std::copy(pos_v.begin(), pos_v.end(), pos.data_as<int64_t>());
  Tensor cos = Tensor::empty({T, c.D / 2}, DType::F32, Device::cuda(0));
  Tensor sin = Tensor::empty({T, c.D / 2}, DType::F32, Device::cuda(0));
  cuda::rope_tables(cuda::to_device(pos, 0), c.D, 1e6, true, cos, sin, stream0());
  const Tensor x = test::device_from_host(test::host_random({rows, c.D}, 641, 1.5f, true), DType::BF16);
  const Tensor w = test::device_from_host(test::host_random({c.D}, 642, 0.3f, true), DType::BF16);
  const Tensor dw0 = test::host_random({c.D}, 643, 1.0f);
  Tensor dx_a = Tensor::empty({rows, c.D}, DType::BF16, Device::cuda(0));
  Tensor dx_b = Tensor::empty({rows, c.D}, DType::BF16, Device::cuda(0));
  Tensor dw_a = test::device_from_host(dw0, DType::F32), dw_b = test::device_from_host(dw0, DType::F32);
  cuda::rmsnorm_rope_backward(dq_bf16, x, w, 1e-6f, cos, sin, dx_a, dw_a, stream0());
  cuda::rmsnorm_rope_backward_from_flash_dq(sums, x, w, 1e-6f, cos, sin, dx_b, dw_b, stream0());
  EXPECT_EQ(test::device_floats(dx_b), test::device_floats(dx_a)) << "dx";
  EXPECT_EQ(test::device_floats(dw_b), test::device_floats(dw_a)) << "dw";
  // Wrong pairing: key heads' rows are not the query heads' sums.
  Tensor xk = Tensor::empty({T * c.Hk, c.D}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::rmsnorm_rope_backward_from_flash_dq(sums, xk, w, 1e-6f, cos, sin, xk, dw_b, stream0()), Error);
}

// The Hopper backward can hand out its fp32 dQ sums instead of a bf16 dq (FlashDqSums): then dq is not touched,
// the sums turn into bf16 dq as the backward would make it (the CPU check of the sm90 dq above covers that
// conversion), and the QK-norm + RoPE backward that reads them directly (rmsnorm_rope_backward_from_flash_dq)
// gives bit for bit what it gives from that bf16 dq: dx and dw. Packed documents, T not a multiple of 64 or 4; the
// second case has more rows than the norm backward's workers (each worker prefetches its next row's sums).
TEST(CudaFlashAttention, Sm90DqSumsFeedTheQkNormRopeBackward) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_backward_runs())
    GTEST_SKIP() << "the sm90 flash-attention backward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  for (const AttnCase& c : {AttnCase{2, 301, 8, 2, 128, 1, 170}, AttnCase{1, 4100, 16, 2, 128, 0, 0}})
    dq_sums_feed_the_qk_norm_rope_backward(c);
}

// The backward's prologue reads dout and out in 16-byte packets and stores dK/dV 8 bytes at a time: a gradient or
// output that starts off those boundaries is a clear error before anything is queued, not a fault on the device.
TEST(CudaFlashAttention, BackwardRejectsMisalignedTensors) {
  MT_SKIP_WITHOUT_CUDA();
  const AttnCase c{1, 64, 2, 1, 64, 0, 0};
  const int64_t T = c.S, nq = T * c.Hq * c.D;
  const BwdInputs in = bwd_inputs(c, 700);
  // The same values one bf16 element past a 16-byte boundary.
  auto shifted = [&](const Tensor& t) {
    Tensor flat = Tensor::empty({t.numel() + 1}, DType::BF16, Device::cuda(0));
    Tensor view = flat.rows(1, t.numel() + 1).view(t.shape());
    MT_CUDA_CHECK(cudaMemcpy(view.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToDevice));
    return view;
  };
  const cuda::FlashAttentionShape shape{T, c.Hq, c.Hk, c.D};
  Tensor dq, dk, dv;
  EXPECT_THROW(cuda::flash_attention_backward(shape, shifted(in.dout), in.q, in.k, in.v, in.out, in.lse, in.docs, dq,
                                              dk, dv, stream0()),
               Error);
  EXPECT_THROW(cuda::flash_attention_backward(shape, in.dout, in.q, in.k, in.v, shifted(in.out), in.lse, in.docs, dq,
                                              dk, dv, stream0()),
               Error);
  Tensor dk_bad = shifted(in.k);
  EXPECT_THROW(cuda::flash_attention_backward(shape, in.dout, in.q, in.k, in.v, in.out, in.lse, in.docs, dq, dk_bad,
                                              dv, stream0()),
               Error);
  // Aligned, the same call runs.
  Tensor dq2, dk2, dv2;
  cuda::flash_attention_backward(shape, in.dout, in.q, in.k, in.v, in.out, in.lse, in.docs, dq2, dk2, dv2, stream0());
  EXPECT_EQ(dq2.numel(), nq);
}

TEST(CudaFlashAttention, OddLengthNoDocumentsD64) {
  MT_SKIP_WITHOUT_CUDA();
  check_case({1, 77, 4, 2, 64, 0, 0}, 10);
  check_case({2, 130, 2, 1, 64, 0, 0}, 11);  // two batch rows: each its own causal sequence
}

TEST(CudaFlashAttention, ManyShortDocumentsD128) {
  MT_SKIP_WITHOUT_CUDA();
  check_case({2, 300, 8, 2, 128, 1, 40}, 20);
  check_case({3, 129, 6, 3, 64, 1, 150}, 21);  // documents spanning query and key tiles
}

TEST(CudaFlashAttention, OneLongDocumentD128) {
  MT_SKIP_WITHOUT_CUDA();
  check_case({1, 1000, 4, 1, 128, 1000, 1000}, 30);
  check_case({1, 517, 2, 2, 128, 60, 200}, 31);  // no GQA
}

// head_dim 32: 64-byte shared rows (4 chunks, the half-line swizzle), 64-key forward tiles, two blocks per SM.
TEST(CudaFlashAttention, HeadDim32) {
  MT_SKIP_WITHOUT_CUDA();
  check_case({1, 77, 4, 2, 32, 0, 0}, 50);     // odd length, one query tile
  check_case({2, 130, 4, 1, 32, 0, 0}, 51);    // two batch rows, MQA, a partial second tile per row
  check_case({2, 300, 8, 2, 32, 1, 40}, 52);   // many short packed documents
  check_case({3, 129, 6, 3, 32, 1, 150}, 53);  // documents spanning query and key tiles
  check_case({1, 700, 4, 4, 32, 700, 700}, 54);  // one long document, no GQA
  check_case({2, 256, 4, 2, 32, 1, 120}, 55);    // the qwen3-moe-tiny quickstart: packed rows of 256
}

// head_dim 16: 32-byte shared rows (2 chunks: chunk ^ (row / 4) % 2), Q·Kᵀ in one mma k-step, three forward
// blocks per SM, 128-query backward steps (the dQ warp split's minimum at 16 columns).
TEST(CudaFlashAttention, HeadDim16) {
  MT_SKIP_WITHOUT_CUDA();
  check_case({1, 77, 4, 2, 16, 0, 0}, 70);       // odd length, one query tile
  check_case({2, 130, 4, 1, 16, 0, 0}, 71);      // two batch rows, MQA, a partial second tile per row
  check_case({2, 300, 8, 2, 16, 1, 40}, 72);     // many short packed documents
  check_case({3, 129, 6, 3, 16, 1, 150}, 73);    // documents spanning query and key tiles
  check_case({1, 700, 4, 4, 16, 700, 700}, 74);  // one long document, no GQA: unmasked tiles, 6 key tiles
  check_case({2, 12, 4, 1, 16, 3, 9}, 75);       // the Transformers fixtures' shape: MQA 4/1, a few tokens
}

// head_dim 256: 32-key forward tiles; the backward runs two 128-column slices of dQ/dK/dV per key tile.
TEST(CudaFlashAttention, HeadDim256) {
  MT_SKIP_WITHOUT_CUDA();
  check_case({1, 77, 4, 2, 256, 0, 0}, 60);
  check_case({2, 130, 2, 1, 256, 0, 0}, 61);
  check_case({2, 300, 4, 2, 256, 1, 40}, 62);
  check_case({3, 129, 6, 3, 256, 1, 150}, 63);
  check_case({1, 517, 4, 1, 256, 517, 517}, 64);  // one long document: unmasked tiles, 5 backward key tiles
}

// cu_seqlens and doc ids describe the same documents; the kernels then give identical bits.
TEST(CudaFlashAttention, CuSeqlensEqualsDocIds) {
  MT_SKIP_WITHOUT_CUDA();
  const AttnCase c{2, 200, 4, 2, 64, 5, 60};
  const std::vector<int32_t> doc = make_docs(c, 40);
  std::vector<int32_t> cu{0};
  for (int t = 1; t <= c.B * c.S; ++t)
    if (t == c.B * c.S || doc[t] != doc[t - 1]) cu.push_back(t);
  cuda::AttentionDocs a =
      cuda::attention_docs_from_ids(cuda::to_device(host_i32({c.B, c.S}, doc), 0), c.B, c.S, 0, stream0());
  cuda::AttentionDocs b = cuda::attention_docs_from_cu_seqlens(
      cuda::to_device(host_i32({static_cast<int64_t>(cu.size())}, cu), 0), c.B * c.S, stream0());
  EXPECT_EQ(host_ints(a.start), host_ints(b.start));
  EXPECT_EQ(host_ints(a.end), host_ints(b.end));
  std::vector<int32_t> st = host_ints(a.start), en = host_ints(a.end);
  for (int t = 0; t < c.B * c.S; ++t) {
    ASSERT_LE(st[t], t);
    ASSERT_GT(en[t], t);
    ASSERT_EQ(doc[st[t]], doc[t]);
    ASSERT_EQ(doc[en[t] - 1], doc[t]);
    if (st[t] > 0) {
      ASSERT_NE(doc[st[t] - 1], doc[t]);
    }
    if (en[t] < c.B * c.S) {
      ASSERT_NE(doc[en[t]], doc[t]);
    }
  }
  Tensor q = test::device_from_host(test::host_random({c.B * c.S, c.Hq, c.D}, 1, 1.0f, true), DType::BF16);
  Tensor kv = test::device_from_host(test::host_random({c.B * c.S, c.Hk, c.D}, 2, 1.0f, true), DType::BF16);
  const cuda::FlashAttentionShape fs{c.B * c.S, c.Hq, c.Hk, c.D};
  Tensor o1, l1, o2, l2;
  cuda::flash_attention_forward(fs, q, kv, kv, a, o1, l1, stream0());
  cuda::flash_attention_forward(fs, q, kv, kv, b, o2, l2, stream0());
  EXPECT_EQ(test::device_floats(o1), test::device_floats(o2));
}

TEST(CudaFlashAttention, BadShapesAreErrors) {
  MT_SKIP_WITHOUT_CUDA();
  cuda::AttentionDocs docs = cuda::attention_docs_from_ids(Tensor(), 1, 8, 0, stream0());
  Tensor q = Tensor::empty({8, 2, 96}, DType::BF16, Device::cuda(0));
  Tensor kv = Tensor::empty({8, 1, 96}, DType::BF16, Device::cuda(0));
  Tensor out, lse;
  EXPECT_THROW(cuda::flash_attention_forward({8, 2, 1, 96}, q, kv, kv, docs, out, lse, stream0()),
               Error);  // head_dim 96
  Tensor q8 = Tensor::empty({8, 2, 8}, DType::BF16, Device::cuda(0));
  Tensor kv8 = Tensor::empty({8, 1, 8}, DType::BF16, Device::cuda(0));
  try {
    cuda::flash_attention_forward({8, 2, 1, 8}, q8, kv8, kv8, docs, out, lse, stream0());
    ADD_FAILURE() << "head_dim 8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 8 (supported: 16, 32, 64, 128, 256)"), std::string::npos)
        << e.what();
  }
  Tensor q512 = Tensor::empty({8, 2, 512}, DType::BF16, Device::cuda(0));
  Tensor kv512 = Tensor::empty({8, 1, 512}, DType::BF16, Device::cuda(0));
  Tensor dq, dk, dv;
  EXPECT_THROW(cuda::flash_attention_backward({8, 2, 1, 512}, q512, q512, kv512, kv512, q512, lse, docs, dq, dk, dv,
                                              stream0()),
               Error);  // head_dim 512
  Tensor q3 = Tensor::empty({8, 3, 64}, DType::BF16, Device::cuda(0));
  Tensor kv2 = Tensor::empty({8, 2, 64}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::flash_attention_forward({8, 3, 2, 64}, q3, kv2, kv2, docs, out, lse, stream0()), Error);  // 3 % 2
  Tensor qf = Tensor::empty({8, 2, 64}, DType::F32, Device::cuda(0));
  Tensor kv1 = Tensor::empty({8, 1, 64}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::flash_attention_forward({8, 2, 1, 64}, qf, kv1, kv1, docs, out, lse, stream0()), Error);  // fp32 q
}

// ---- Sliding window, sinks and a given softmax scale (GPT-OSS; thresholds in the header) ----

struct FeatureCase {
  AttnCase c;
  int window;   // 0: full causal
  bool sinks;   // a sink logit per query head
  float scale;  // 0: head_dim^-1/2
};

std::string feature_name(const FeatureCase& f) {
  const AttnCase& c = f.c;
  return "B " + std::to_string(c.B) + " S " + std::to_string(c.S) + " Hq " + std::to_string(c.Hq) + " Hk " +
         std::to_string(c.Hk) + " D " + std::to_string(c.D) + " docs " + std::to_string(c.min_doc) + ".." +
         std::to_string(c.max_doc) + " window " + std::to_string(f.window) + (f.sinks ? " sinks" : " no sinks") +
         " scale " + std::to_string(f.scale);
}

// Sink logits in [-1, 6]: from a few percent of a 128-key row's weight to most of a short row's.
Tensor host_sinks(int heads, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 6.0f);
  std::vector<float> v(static_cast<size_t>(heads));
  for (float& x : v) x = u(g);
  return Tensor::from_floats({heads}, v);
}

// The host inputs of a case (bf16-representable, so the GPU sees the same numbers) and the CPU reference.
struct FeatureRef {
  Tensor q, k, v, dout, doc, sinks;  // host; doc and sinks may be undefined
  std::vector<float> out, lse, dq, dk, dv, dsinks;
};

FeatureRef feature_reference(const FeatureCase& f, uint64_t seed) {
  const AttnCase& c = f.c;
  FeatureRef r;
  const std::vector<int32_t> doc = make_docs(c, seed);
  if (!doc.empty()) r.doc = host_i32({c.B, c.S}, doc);
  r.q = test::host_random({c.B, c.S, c.Hq, c.D}, seed + 1, 1.0f, true);
  r.k = test::host_random({c.B, c.S, c.Hk, c.D}, seed + 2, 1.0f, true);
  r.v = test::host_random({c.B, c.S, c.Hk, c.D}, seed + 3, 1.0f, true);
  r.dout = test::host_random({c.B, c.S, c.Hq, c.D}, seed + 4, 1.0f, true);
  if (f.sinks) r.sinks = host_sinks(c.Hq, seed + 5);
  cpu::AttentionShape cs{c.B, c.S, c.Hq, c.Hk, c.D};
  cs.window = f.window;
  cs.scale = f.scale;
  Tensor lse, dq, dk, dv;
  r.out = cpu::attention_forward(cs, r.q, r.k, r.v, r.doc, true, lse, r.sinks).to_floats();
  r.lse = lse.to_floats();
  Tensor dsinks = Tensor::zeros({c.Hq}, DType::F32);
  cpu::attention_backward(cs, r.dout, r.q, r.k, r.v, r.doc, lse, true, dq, dk, dv, r.sinks,
                          f.sinks ? &dsinks : nullptr);
  r.dq = dq.to_floats(), r.dk = dk.to_floats(), r.dv = dv.to_floats();
  if (f.sinks) r.dsinks = dsinks.to_floats();
  return r;
}

cuda::FlashAttentionShape flash_shape(const FeatureCase& f) {
  cuda::FlashAttentionShape s{int64_t{f.c.B} * f.c.S, f.c.Hq, f.c.Hk, f.c.D};
  s.window = f.window;
  s.scale = f.scale;
  return s;
}

// The case's device inputs and the GPU forward's out and lse.
struct FeatureDev {
  cuda::AttentionDocs docs;
  Tensor q, k, v, dout, sinks, out, lse;
};

FeatureDev feature_forward(const FeatureCase& f, const FeatureRef& r) {
  FeatureDev d;
  d.docs = cuda::attention_docs_from_ids(r.doc.defined() ? cuda::to_device(r.doc, 0) : Tensor(), f.c.B, f.c.S, 0,
                                         stream0());
  d.q = test::device_from_host(r.q, DType::BF16);
  d.k = test::device_from_host(r.k, DType::BF16);
  d.v = test::device_from_host(r.v, DType::BF16);
  d.dout = test::device_from_host(r.dout, DType::BF16);
  if (r.sinks.defined()) d.sinks = cuda::to_device(r.sinks, 0);
  cuda::flash_attention_forward(flash_shape(f), d.q, d.k, d.v, d.docs, d.out, d.lse, stream0(), d.sinks);
  return d;
}

// dsinks starts from these values, so the test sees that the backward adds (+=) rather than overwrites.
constexpr float kDsinksStart = 0.25f;

struct FeatureGrads {
  std::vector<float> dq, dk, dv, dsinks;  // dsinks: what the backward added (empty without sinks)
  std::vector<float> dsinks_raw;          // dsinks as the backward left it (bitwise checks)
};

FeatureGrads feature_backward(const FeatureCase& f, const FeatureDev& d, cuda::FlashBwdMode mode) {
  Tensor dq, dk, dv, dsinks;
  if (f.sinks)
    dsinks = cuda::to_device(Tensor::from_floats({f.c.Hq}, std::vector<float>(f.c.Hq, kDsinksStart)), 0);
  cuda::flash_attention_backward(flash_shape(f), d.dout, d.q, d.k, d.v, d.out, d.lse, d.docs, dq, dk, dv, stream0(),
                                 nullptr, mode, d.sinks, f.sinks ? &dsinks : nullptr);
  FeatureGrads g{test::device_floats(dq), test::device_floats(dk), test::device_floats(dv), {}, {}};
  if (f.sinks) {
    g.dsinks_raw = test::device_floats(dsinks);
    for (float x : g.dsinks_raw) g.dsinks.push_back(x - kDsinksStart);
  }
  return g;
}

// A gradient against the CPU: the header's thresholds, or, where the CPU's is exactly zero (window 1 without a
// sink: dS = 0), an absolute bound on the GPU's rounding noise.
void expect_grad(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  const bool zero = std::all_of(want.begin(), want.end(), [](float x) { return x == 0.0f; });
  if (!zero) return test::expect_norm(got, want, 2e-2, 1e-2, what);
  ASSERT_EQ(got.size(), want.size()) << what;
  float worst = 0;
  for (float x : got) worst = std::max(worst, std::fabs(x));
  EXPECT_LE(worst, 1e-4f) << what << ": the reference is exactly 0";
}

// Forward (out, lse) and both backwards (dq, dk, dv, dsinks) of one case against the CPU op.
void check_feature_case(const FeatureCase& f, uint64_t seed) {
  SCOPED_TRACE(feature_name(f));
  const FeatureRef r = feature_reference(f, seed);
  const FeatureDev d = feature_forward(f, r);
  test::expect_norm(test::device_floats(d.out), r.out, 1e-2, 5e-3, "out");
  const double worst = lse_max_abs(f.c, test::device_floats(d.lse), r.lse);
  EXPECT_LE(worst, 1e-4) << "lse";
  if (std::getenv("MT_PRINT_ERRORS")) std::printf("[ error    ] lse: max abs %.3g (limit 1e-4)\n", worst);
  for (const cuda::FlashBwdMode mode : {cuda::FlashBwdMode::fast, cuda::FlashBwdMode::deterministic}) {
    const std::string name = mode == cuda::FlashBwdMode::fast ? "fast " : "deterministic ";
    const FeatureGrads g = feature_backward(f, d, mode);
    expect_grad(g.dq, r.dq, name + "dq");
    expect_grad(g.dk, r.dk, name + "dk");
    expect_grad(g.dv, r.dv, name + "dv");
    if (f.sinks) test::expect_norm(g.dsinks, r.dsinks, 2e-2, 1e-2, name + "dsinks");
  }
}

// GPT-OSS's attention: head_dim 64, 8 query heads per KV head, a 128-key window with sinks (scale 64^-0.5 given
// explicitly, as the model does), one long row and packed documents shorter and longer than the window
// (boundaries inside it and across it); then windows 1 (each row sees itself and the sink), 7 (inside a key tile)
// and longer than the sequence (no window), with and without sinks, scales other than D^-0.5, T not a multiple of
// the tiles.
TEST(CudaFlashAttentionWindowSinks, HeadDim64MatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const std::vector<FeatureCase> cases = {
      {{1, 517, 16, 2, 64, 0, 0}, 128, true, 0.125f},
      {{2, 300, 16, 2, 64, 1, 150}, 128, true, 0.0f},
      {{1, 700, 8, 1, 64, 90, 400}, 128, false, 0.0f},
      {{1, 300, 8, 1, 64, 0, 0}, 1, true, 0.0f},
      {{2, 150, 8, 2, 64, 1, 40}, 1, false, 0.0f},
      {{2, 200, 8, 2, 64, 5, 60}, 7, true, 0.3f},
      {{1, 333, 4, 4, 64, 0, 0}, 7, false, 0.05f},
      {{1, 333, 8, 2, 64, 1, 200}, 1000, true, 0.0f},
      {{1, 257, 8, 2, 64, 0, 0}, 0, true, 0.2f},
  };
  for (size_t i = 0; i < cases.size(); ++i) check_feature_case(cases[i], 1100 + 10 * i);
}

// head_dim 128: the same features on the mma.sync kernels (the Hopper ones have none of them; a window longer
// than the sequence is no window and may run there).
TEST(CudaFlashAttentionWindowSinks, HeadDim128MatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const std::vector<FeatureCase> cases = {
      {{2, 300, 16, 2, 128, 1, 150}, 128, true, 0.0f},
      {{1, 517, 8, 1, 128, 0, 0}, 128, false, 0.1f},
      {{1, 300, 4, 2, 128, 1, 100}, 1, true, 0.0f},
      {{1, 200, 4, 1, 128, 0, 0}, 1, false, 0.0f},
      {{2, 170, 8, 2, 128, 3, 50}, 7, true, 0.0f},
      {{1, 517, 4, 2, 128, 0, 0}, 7, false, 0.2f},
      {{1, 400, 8, 2, 128, 0, 0}, 1000, false, 0.0f},
      {{1, 300, 8, 2, 128, 1, 100}, 1000, true, 0.0f},
      {{2, 129, 4, 1, 128, 0, 0}, 0, false, 0.05f},
  };
  for (size_t i = 0; i < cases.size(); ++i) check_feature_case(cases[i], 1300 + 10 * i);
}

// The other head dims' tile shapes (16: 128-query backward steps; 32: two blocks per SM; 256: 32-key forward tiles
// and two backward column slices) with a window and sinks.
TEST(CudaFlashAttentionWindowSinks, OtherHeadDimsMatchCpu) {
  MT_SKIP_WITHOUT_CUDA();
  check_feature_case({{2, 200, 8, 2, 16, 1, 90}, 37, true, 0.0f}, 1500);
  check_feature_case({{1, 300, 8, 1, 32, 0, 0}, 100, true, 0.3f}, 1510);
  check_feature_case({{2, 150, 4, 2, 256, 1, 80}, 50, true, 0.0f}, 1520);
}

// At GPT-OSS's sliding-layer shape (seq 4096, 64 / 8 heads, head_dim 64, window 128, sinks; packed documents):
// the deterministic backward repeats bit for bit (dq, dk, dv and dsinks), dsinks also in the fast mode (its own
// fixed-order kernel), and the two modes agree within the CPU tolerance.
TEST(CudaFlashAttentionWindowSinks, BackwardRepeatsBitwiseWithSinks) {
  MT_SKIP_WITHOUT_CUDA();
  const FeatureCase f{{1, 4096, 64, 8, 64, 1, 1500}, 128, true, 0.125f};
  FeatureRef r;  // inputs only: the CPU reference would take minutes at this size
  const std::vector<int32_t> doc = make_docs(f.c, 4300);
  r.doc = host_i32({1, f.c.S}, doc);
  r.q = test::host_random({1, f.c.S, f.c.Hq, f.c.D}, 4301, 1.0f, true);
  r.k = test::host_random({1, f.c.S, f.c.Hk, f.c.D}, 4302, 1.0f, true);
  r.v = test::host_random({1, f.c.S, f.c.Hk, f.c.D}, 4303, 1.0f, true);
  r.dout = test::host_random({1, f.c.S, f.c.Hq, f.c.D}, 4304, 1.0f, true);
  r.sinks = host_sinks(f.c.Hq, 4305);
  const FeatureDev d = feature_forward(f, r);
  using M = cuda::FlashBwdMode;
  const FeatureGrads a = feature_backward(f, d, M::deterministic);
  for (int rep = 0; rep < 2; ++rep) {
    const FeatureGrads b = feature_backward(f, d, M::deterministic);
    EXPECT_TRUE(bitwise_equal(a.dq, b.dq)) << "dq differs on repeat " << rep;
    EXPECT_TRUE(bitwise_equal(a.dk, b.dk)) << "dk differs on repeat " << rep;
    EXPECT_TRUE(bitwise_equal(a.dv, b.dv)) << "dv differs on repeat " << rep;
    EXPECT_TRUE(bitwise_equal(a.dsinks_raw, b.dsinks_raw)) << "dsinks differ on repeat " << rep;
  }
  const FeatureGrads f1 = feature_backward(f, d, M::fast), f2 = feature_backward(f, d, M::fast);
  EXPECT_TRUE(bitwise_equal(f1.dsinks_raw, f2.dsinks_raw)) << "fast-mode dsinks differ run to run";
  EXPECT_TRUE(bitwise_equal(f1.dsinks_raw, a.dsinks_raw)) << "dsinks differ between the modes (same kernel, same delta)";
  test::expect_norm(a.dq, f1.dq, 2e-2, 1e-2, "deterministic vs fast dq");
  test::expect_norm(a.dk, f1.dk, 2e-2, 1e-2, "deterministic vs fast dk");
  test::expect_norm(a.dv, f1.dv, 2e-2, 1e-2, "deterministic vs fast dv");
  // Not all zero: a dsinks kernel that never ran would repeat too.
  EXPECT_TRUE(std::any_of(a.dsinks.begin(), a.dsinks.end(), [](float x) { return x != 0.0f; }));
}

// The head_dim 128 Hopper kernels have no window, sinks or other scale: forcing them with one is a clear error; under Auto the
// call runs the mma.sync kernels (on a cc 9.0 GPU too), and the backward then makes dq and leaves dq_sums empty.
TEST(CudaFlashAttentionWindowSinks, Sm90RefusesFeaturesAndAutoRoutesThemToMmaSync) {
  MT_SKIP_WITHOUT_CUDA();
  const FeatureCase f{{1, 200, 4, 2, 128, 0, 0}, 64, true, 0.0f};
  const FeatureRef r = feature_reference(f, 1700);
  FeatureDev d = feature_forward(f, r);  // Auto
  test::expect_norm(test::device_floats(d.out), r.out, 1e-2, 5e-3, "auto out");
  {
    FwdKernelScope scope(cuda::detail::FlashFwdKernel::Sm90);
    Tensor out, lse;
    try {
      cuda::flash_attention_forward(flash_shape(f), d.q, d.k, d.v, d.docs, out, lse, stream0(), d.sinks);
      ADD_FAILURE() << "the sm90 forward accepted a window and sinks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sm90 kernel has no sliding window"), std::string::npos) << e.what();
    }
    FeatureCase scaled = f;
    scaled.window = 0, scaled.sinks = false, scaled.scale = 0.5f;
    EXPECT_THROW(cuda::flash_attention_forward(flash_shape(scaled), d.q, d.k, d.v, d.docs, out, lse, stream0()),
                 Error);
  }
  {
    BwdKernelScope scope(cuda::detail::FlashBwdKernel::Sm90);
    Tensor dq, dk, dv;
    EXPECT_THROW(cuda::flash_attention_backward(flash_shape(f), d.dout, d.q, d.k, d.v, d.out, d.lse, d.docs, dq, dk,
                                                dv, stream0()),
                 Error);
  }
  Tensor dq, dk, dv;
  Tensor dsinks = cuda::to_device(Tensor::zeros({f.c.Hq}, DType::F32), 0);
  cuda::FlashDqSums sums;
  cuda::flash_attention_backward(flash_shape(f), d.dout, d.q, d.k, d.v, d.out, d.lse, d.docs, dq, dk, dv, stream0(),
                                 &sums, cuda::FlashBwdMode::fast, d.sinks, &dsinks);
  EXPECT_FALSE(sums.acc.defined()) << "the mma.sync backward makes dq, not dQ sums";
  ASSERT_TRUE(dq.defined());
  test::expect_norm(test::device_floats(dq), r.dq, 2e-2, 1e-2, "auto dq");
  test::expect_norm(test::device_floats(dsinks), r.dsinks, 2e-2, 1e-2, "auto dsinks");
}

// ---- The Hopper forward at head_dim 64 (GPT-OSS): window, sinks and a given scale ----
// Forced with flash_fwd_kernel_set(Sm90) (Auto takes it unless MIXTUNE_FLASH_FWD_SM90_HD64=0). Thresholds as
// the header's: the kernel scores and normalises in fp32 and rounds the unnormalised P to bf16 before P·V as the
// mma.sync forward does; only its key tiles are 128 wide instead of 64, so the running max where P is rounded
// differs: out within about one bf16 rounding of the CPU (max-norm 1e-2, rel-L2 5e-3), lse fp32 on both sides
// (1e-4 absolute). A key leaking in from outside the window or the document, a missing sink term or a sink in the
// wrong place is an O(1) error in out or lse. Against the mma.sync forward at GPT-OSS's size (no CPU reference
// there: minutes) as Sm90AndMmaSyncForwardsAgreeD128 does: out 1e-2 / 5e-3, lse 1e-3.

bool sm90_forward_runs_d64() {
  (void)stream0();
  cuda::detail::FlashArgs a;
  a.T = 128, a.Hq = 1, a.Hk = 1, a.D = 64;
  return cuda::detail::flash_fwd_sm90_supported(a);
}

// The forward of one feature case with the given kernel: out and lse.
FwdOut feature_forward_with(cuda::detail::FlashFwdKernel kind, const FeatureCase& f, const FeatureRef& r) {
  FwdKernelScope scope(kind);
  const FeatureDev d = feature_forward(f, r);
  return {test::device_floats(d.out), test::device_floats(d.lse)};
}

// The inputs of a case without the CPU reference (for sizes where the CPU would take minutes).
FeatureRef feature_inputs(const FeatureCase& f, uint64_t seed) {
  const AttnCase& c = f.c;
  FeatureRef r;
  const std::vector<int32_t> doc = make_docs(c, seed);
  if (!doc.empty()) r.doc = host_i32({c.B, c.S}, doc);
  r.q = test::host_random({c.B, c.S, c.Hq, c.D}, seed + 1, 1.0f, true);
  r.k = test::host_random({c.B, c.S, c.Hk, c.D}, seed + 2, 1.0f, true);
  r.v = test::host_random({c.B, c.S, c.Hk, c.D}, seed + 3, 1.0f, true);
  r.dout = test::host_random({c.B, c.S, c.Hq, c.D}, seed + 4, 1.0f, true);
  if (f.sinks) r.sinks = host_sinks(c.Hq, seed + 5);
  return r;
}

// Windows 0 (full causal), 1 (each row sees itself and the sink), 7 (inside a key tile) and 128 (GPT-OSS: spans
// two key tiles), each with and without sinks; GQA 8:1, 4:1 and none; packed documents shorter and longer than the
// window; T not a multiple of 128 (a partial last query tile, key tiles past T); scales other than 64^-1/2.
TEST(CudaFlashAttentionWindowSinks, Sm90HeadDim64MatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_forward_runs_d64())
    GTEST_SKIP() << "the sm90 flash-attention forward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  const std::vector<FeatureCase> cases = {
      {{1, 517, 16, 2, 64, 0, 0}, 128, true, 0.125f},
      {{2, 300, 16, 2, 64, 1, 150}, 128, true, 0.0f},
      {{1, 700, 8, 1, 64, 90, 400}, 128, false, 0.0f},
      {{1, 300, 8, 1, 64, 0, 0}, 1, true, 0.0f},
      {{2, 150, 8, 2, 64, 1, 40}, 1, false, 0.0f},
      {{2, 200, 8, 2, 64, 5, 60}, 7, true, 0.3f},
      {{1, 333, 4, 4, 64, 0, 0}, 7, false, 0.05f},
      {{1, 257, 8, 1, 64, 0, 0}, 0, true, 0.2f},
      {{2, 300, 8, 1, 64, 1, 150}, 0, false, 0.0f},
      {{1, 333, 8, 2, 64, 1, 200}, 1000, true, 0.0f},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const FeatureCase& f = cases[i];
    SCOPED_TRACE(feature_name(f));
    const FeatureRef r = feature_reference(f, 2100 + 10 * i);
    const FwdOut got = feature_forward_with(cuda::detail::FlashFwdKernel::Sm90, f, r);
    test::expect_norm(got.out, r.out, 1e-2, 5e-3, "sm90 out");
    const double worst = lse_max_abs(f.c, got.lse, r.lse);
    EXPECT_LE(worst, 1e-4) << "sm90 lse";
    if (std::getenv("MT_PRINT_ERRORS")) std::printf("[ error    ] sm90 lse: max abs %.3g (limit 1e-4)\n", worst);
  }
}

// GPT-OSS's attention layers at the bench's size (seq 4096, 64 / 8 heads, head_dim 64, scale 1/8): the sliding
// layer (window 128, sinks) and the full layer (sinks), one long row and packed documents of 1..1500 tokens, then
// two batch rows of 1987 (T not a multiple of 128): sm90 against mma.sync. Every row sees itself and its sink, so
// every lse is finite on both.
TEST(CudaFlashAttentionWindowSinks, Sm90AndMmaSyncForwardsAgreeD64) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_forward_runs_d64())
    GTEST_SKIP() << "the sm90 flash-attention forward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  using K = cuda::detail::FlashFwdKernel;
  const std::vector<FeatureCase> cases = {
      {{1, 4096, 64, 8, 64, 0, 0}, 128, true, 0.125f},    {{1, 4096, 64, 8, 64, 1, 1500}, 128, true, 0.125f},
      {{1, 4096, 64, 8, 64, 1, 1500}, 0, true, 0.125f},   {{2, 1987, 64, 8, 64, 1, 700}, 128, true, 0.125f},
      {{2, 1987, 64, 8, 64, 0, 0}, 0, false, 0.0f},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const FeatureCase& f = cases[i];
    SCOPED_TRACE(feature_name(f));
    const FeatureRef r = feature_inputs(f, 2300 + 10 * i);
    const FwdOut a = feature_forward_with(K::Sm90, f, r), b = feature_forward_with(K::MmaSync, f, r);
    test::expect_norm(a.out, b.out, 1e-2, 5e-3, "sm90 vs mma out");
    ASSERT_EQ(a.lse.size(), b.lse.size());
    double worst = 0;
    size_t non_finite = 0;
    for (size_t j = 0; j < a.lse.size(); ++j) {
      if (!std::isfinite(a.lse[j]) || !std::isfinite(b.lse[j]))
        ++non_finite;
      else
        worst = std::max(worst, std::fabs(double(a.lse[j]) - b.lse[j]));
    }
    EXPECT_EQ(non_finite, 0u) << "lse: every row sees at least itself";
    EXPECT_LE(worst, 1e-3) << "sm90 vs mma lse";
  }
}

// The pinned softmax at head_dim 64 (window and sinks): bit for bit the unpinned loop's out and lse.
TEST(CudaFlashAttentionWindowSinks, Sm90HeadDim64EarlySoftmaxIsBitwiseTheSame) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_forward_runs_d64())
    GTEST_SKIP() << "the sm90 flash-attention forward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  const FeatureCase f{{2, 1300, 16, 2, 64, 1, 700}, 128, true, 0.125f};
  const FeatureRef r = feature_inputs(f, 2400);
  FwdOut late, early;
  {
    FwdEarlyScope scope(0);
    late = feature_forward_with(cuda::detail::FlashFwdKernel::Sm90, f, r);
  }
  {
    FwdEarlyScope scope(1);
    early = feature_forward_with(cuda::detail::FlashFwdKernel::Sm90, f, r);
  }
  EXPECT_TRUE(bitwise_equal(late.out, early.out)) << "out";
  EXPECT_TRUE(bitwise_equal(late.lse, early.lse)) << "lse";
}

// Auto takes the sm90 forward at head_dim 64 unless MIXTUNE_FLASH_FWD_SM90_HD64=0 (read once per process):
// bitwise the forced sm90 result without it, bitwise the forced mma.sync result with it.
TEST(CudaFlashAttentionWindowSinks, AutoTakesSm90HeadDim64UnlessOptedOut) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_forward_runs_d64())
    GTEST_SKIP() << "the sm90 flash-attention forward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  using K = cuda::detail::FlashFwdKernel;
  const FeatureCase f{{1, 700, 16, 2, 64, 1, 300}, 128, true, 0.125f};
  const FeatureRef r = feature_inputs(f, 2500);
  const FwdOut autos = feature_forward_with(K::Auto, f, r);
  const char* e = std::getenv("MIXTUNE_FLASH_FWD_SM90_HD64");
  const char* fwd = std::getenv("MIXTUNE_FLASH_FWD");
  const bool sm90 = !(e && std::string(e) == "0") && !(fwd && std::string(fwd) == "mma");
  const FwdOut want = feature_forward_with(sm90 ? K::Sm90 : K::MmaSync, f, r);
  EXPECT_TRUE(bitwise_equal(autos.out, want.out)) << (sm90 ? "default: not the sm90 result" : "opted out: not the mma.sync result");
  EXPECT_TRUE(bitwise_equal(autos.lse, want.lse));
}

TEST(CudaFlashAttentionWindowSinks, BadArgumentsAreErrors) {
  MT_SKIP_WITHOUT_CUDA();
  const FeatureCase f{{1, 64, 2, 1, 64, 0, 0}, 16, true, 0.0f};
  const FeatureRef r = feature_reference(f, 1800);
  const FeatureDev d = feature_forward(f, r);
  Tensor out, lse;
  cuda::FlashAttentionShape neg = flash_shape(f);
  neg.window = -1;
  EXPECT_THROW(cuda::flash_attention_forward(neg, d.q, d.k, d.v, d.docs, out, lse, stream0()), Error);
  cuda::FlashAttentionShape bad_scale = flash_shape(f);
  bad_scale.scale = -0.5f;
  EXPECT_THROW(cuda::flash_attention_forward(bad_scale, d.q, d.k, d.v, d.docs, out, lse, stream0()), Error);
  const Tensor sinks3 = cuda::to_device(Tensor::zeros({3}, DType::F32), 0);  // 2 heads
  EXPECT_THROW(cuda::flash_attention_forward(flash_shape(f), d.q, d.k, d.v, d.docs, out, lse, stream0(), sinks3),
               Error);
  const Tensor sinks_bf16 = test::device_from_host(r.sinks, DType::BF16);
  EXPECT_THROW(cuda::flash_attention_forward(flash_shape(f), d.q, d.k, d.v, d.docs, out, lse, stream0(), sinks_bf16),
               Error);
  const Tensor sinks_host = r.sinks;
  EXPECT_THROW(cuda::flash_attention_forward(flash_shape(f), d.q, d.k, d.v, d.docs, out, lse, stream0(), sinks_host),
               Error);
  Tensor dq, dk, dv;
  Tensor dsinks = cuda::to_device(Tensor::zeros({f.c.Hq}, DType::F32), 0);
  EXPECT_THROW(cuda::flash_attention_backward(flash_shape(f), d.dout, d.q, d.k, d.v, d.out, d.lse, d.docs, dq, dk, dv,
                                              stream0(), nullptr, cuda::FlashBwdMode::fast, Tensor(), &dsinks),
               Error);  // dsinks without sinks
  Tensor dsinks3 = cuda::to_device(Tensor::zeros({3}, DType::F32), 0);
  EXPECT_THROW(cuda::flash_attention_backward(flash_shape(f), d.dout, d.q, d.k, d.v, d.out, d.lse, d.docs, dq, dk, dv,
                                              stream0(), nullptr, cuda::FlashBwdMode::fast, d.sinks, &dsinks3),
               Error);
}

}  // namespace
}  // namespace mt
