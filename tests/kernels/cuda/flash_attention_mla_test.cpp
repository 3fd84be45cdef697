// CUDA flash attention with MLA's head sizes (DeepSeek-V3: q and k 192 columns, v and the output 128;
// FlashAttentionShape::v_dim) against cpu::attention_forward / attention_backward with AttentionShape::v_dim, in bf16
// mode: forward out and lse, backward dq, dk, dv, with the mma.sync kernels (both backward shapes: one column
// slice and two, flash_bwd_mla_slices_set; fast and deterministic), and the Hopper forward and backward where they
// run (forced; Auto takes both unless MIXTUNE_FLASH_FWD_SM90_MLA=0 / MIXTUNE_FLASH_BWD_SM90_MLA=0).
//
// Shapes: one row of 256..1024 tokens, 4..16 heads, MHA (MLA broadcasts its shared RoPE key over the heads, so
// every query head has its own key and value head), packed documents, odd lengths, two batch rows; one GQA case
// (the kernels take it); DeepSeek-V3's softmax scale (192^-1/2 · mscale², mscale = 0.1·ln(40) + 1: 0.1352) and, in
// one case, a window and sinks (the kernels share them with every head size).
//
// Thresholds, derived as in flash_attention_test.cpp's header: both sides take the same bf16 inputs and score and
// normalise in fp32; the CPU rounds the normalised P to bf16 before P·V, the GPU the unnormalised exp, then
// normalises and rounds the output once: out within about one bf16 rounding (max-norm 1e-2, rel-L2 5e-3); lse fp32
// on both sides (1e-4 absolute). Scores sum 192 products instead of 128 in fp32 (relative error ~1e-7 larger, far
// under lse's 1e-4), and with scale 192^-1/2 (or MLA's 0.1352 on unit inputs: scores of standard deviation 1.9
// instead of 1) the exponentials stay in the range the header's measurements cover. The backward rounds P and dS
// to bf16 for the tensor cores where the CPU keeps dS in fp32, and its outputs are bf16: max-norm 2e-2, rel-L2
// 1e-2. A wrong column count, a value column read from a key column or a tile row of the wrong width is an O(1)
// error. The two backward shapes differ in summation order only (fp32 sums of the same bf16 products): 1e-2 /
// 2e-3 against each other. The deterministic backward repeats bit for bit.
// Sm90 forward (192 / 128: three 64-column boxes per Q and K row, two per V row): the same rounding points as the
// mma.sync forward, only 128-key tiles instead of 64 (the running max where P is rounded differs): out 1e-2 /
// 5e-3 and lse 1e-4 against the CPU, out 1e-2 / 5e-3 and lse 1e-3 against the mma.sync forward at the bench's size.
// Sm90 backward (192 / 128: 96-key items, 3 consumer warpgroups; flash_attention_bwd_sm90_mla.cu), derived as the
// head_dim 128 sm90 backward's tests (flash_attention_test.cpp, Sm90AndMmaSyncBackwardsAgreeD128): it rounds P and
// dS to bf16 for the tensor cores as the mma.sync backward does, forms dS from the bf16 P (the mma.sync one from the
// fp32 P: a difference of about one bf16 rounding of P inside dS) and sums in fp32 in another order; its outputs
// are bf16. So it meets the CPU tolerance above (2e-2 / 1e-2) and agrees with the mma.sync backward within it at the
// bench's size (measured at head_dim 128 on an H200: sm90 vs CPU ≤ 5.2e-3 / 3.2e-3, sm90 vs mma.sync dq/dk rel-L2
// 3.5e-3, dv 1e-5). A key or column slice of the wrong warpgroup, a transposed P or dS tile, a wrong dQ third or a
// wrong KV head in the flush is an O(1) error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_dims.h"
#include "kernels/cuda/flash_attention_kernels.h"

namespace mt {
namespace {

constexpr int kDqk = 192, kDv = 128;
// DeepSeek-V3's softmax scale: qk_head_dim^-1/2 · mscale², mscale = 0.1 · mscale_all_dim · ln(factor 40) + 1.
const float kDsv3Scale = [] {
  const float m = 0.1f * std::log(40.0f) + 1.0f;
  return m * m / std::sqrt(192.0f);
}();

cudaStream_t stream0() { return cuda::device_context(0).stream; }

struct MlaCase {
  int B, S, Hq, Hk;
  int min_doc, max_doc;  // document lengths drawn uniformly; 0 = no doc ids (one causal sequence per row)
  float scale = 0.0f;    // 0: 192^-1/2
  int window = 0;
  bool sinks = false;
};

std::string name(const MlaCase& c) {
  return "B " + std::to_string(c.B) + " S " + std::to_string(c.S) + " Hq " + std::to_string(c.Hq) + " Hk " +
         std::to_string(c.Hk) + " docs " + std::to_string(c.min_doc) + ".." + std::to_string(c.max_doc) + " scale " +
         std::to_string(c.scale) + " window " + std::to_string(c.window) + (c.sinks ? " sinks" : "");
}

std::vector<int32_t> make_docs(const MlaCase& c, uint64_t seed) {
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

// Host inputs (bf16-representable) of a case.
struct Inputs {
  Tensor q, k, v, dout, doc, sinks;  // doc, sinks may be undefined
};

Inputs make_inputs(const MlaCase& c, uint64_t seed) {
  Inputs in;
  in.q = test::host_random({c.B, c.S, c.Hq, kDqk}, seed + 1, 1.0f, true);
  in.k = test::host_random({c.B, c.S, c.Hk, kDqk}, seed + 2, 1.0f, true);
  in.v = test::host_random({c.B, c.S, c.Hk, kDv}, seed + 3, 1.0f, true);
  in.dout = test::host_random({c.B, c.S, c.Hq, kDv}, seed + 4, 1.0f, true);
  const std::vector<int32_t> doc = make_docs(c, seed);
  if (!doc.empty()) {
    in.doc = Tensor::empty({c.B, c.S}, DType::I32);
    std::copy(doc.begin(), doc.end(), in.doc.data_as<int32_t>());
  }
  if (c.sinks) {
    std::mt19937_64 g(seed + 5);
    std::uniform_real_distribution<float> u(-1.0f, 6.0f);
    std::vector<float> s(static_cast<size_t>(c.Hq));
    for (float& x : s) x = u(g);
    in.sinks = Tensor::from_floats({c.Hq}, s);
  }
  return in;
}

struct Ref {
  std::vector<float> out, lse, dq, dk, dv;
};

Ref cpu_reference(const MlaCase& c, const Inputs& in) {
  cpu::AttentionShape cs{c.B, c.S, c.Hq, c.Hk, kDqk};
  cs.v_dim = kDv;
  cs.scale = c.scale;
  cs.window = c.window;
  Tensor lse, dq, dk, dv;
  Ref r;
  r.out = cpu::attention_forward(cs, in.q, in.k, in.v, in.doc, true, lse, in.sinks).to_floats();
  r.lse = lse.to_floats();
  cpu::attention_backward(cs, in.dout, in.q, in.k, in.v, in.doc, lse, true, dq, dk, dv, in.sinks);
  r.dq = dq.to_floats(), r.dk = dk.to_floats(), r.dv = dv.to_floats();
  return r;
}

cuda::FlashAttentionShape flash_shape(const MlaCase& c) {
  cuda::FlashAttentionShape s{int64_t{c.B} * c.S, c.Hq, c.Hk, kDqk};
  s.v_dim = kDv;
  s.scale = c.scale;
  s.window = c.window;
  return s;
}

// The device copies of a case's inputs and the forward's out and lse (Auto's forward: mma.sync unless opted in).
struct Dev {
  cuda::AttentionDocs docs;
  Tensor q, k, v, dout, sinks, out, lse;
};

Dev to_device(const MlaCase& c, const Inputs& in) {
  Dev d;
  d.docs = cuda::attention_docs_from_ids(in.doc.defined() ? cuda::to_device(in.doc, 0) : Tensor(), c.B, c.S, 0,
                                         stream0());
  d.q = test::device_from_host(in.q, DType::BF16);
  d.k = test::device_from_host(in.k, DType::BF16);
  d.v = test::device_from_host(in.v, DType::BF16);
  d.dout = test::device_from_host(in.dout, DType::BF16);
  if (in.sinks.defined()) d.sinks = test::device_from_host(in.sinks, DType::F32);
  return d;
}

void forward(const MlaCase& c, Dev& d, cuda::detail::FlashFwdKernel kind) {
  cuda::detail::flash_fwd_kernel_set(kind);
  d.out = Tensor(), d.lse = Tensor();
  try {
    cuda::flash_attention_forward(flash_shape(c), d.q, d.k, d.v, d.docs, d.out, d.lse, stream0(), d.sinks);
  } catch (...) {
    cuda::detail::flash_fwd_kernel_set(cuda::detail::FlashFwdKernel::Auto);
    throw;
  }
  cuda::detail::flash_fwd_kernel_set(cuda::detail::FlashFwdKernel::Auto);
}

struct Grads {
  std::vector<float> dq, dk, dv;
};

// The mma.sync backward with `slices` column slices (1 or 2) in `mode`.
Grads backward(const MlaCase& c, const Dev& d, int slices, cuda::FlashBwdMode mode) {
  cuda::detail::flash_bwd_mla_slices_set(slices);
  Tensor dq, dk, dv;
  cuda::flash_attention_backward(flash_shape(c), d.dout, d.q, d.k, d.v, d.out, d.lse, d.docs, dq, dk, dv, stream0(),
                                 nullptr, mode, d.sinks);
  cuda::detail::flash_bwd_mla_slices_set(-1);
  return {test::device_floats(dq), test::device_floats(dk), test::device_floats(dv)};
}

double lse_max_abs(const MlaCase& c, const std::vector<float>& gpu, const std::vector<float>& cpu) {
  const int T = c.B * c.S;
  double worst = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.S; ++i)
        worst = std::max(worst, std::fabs(double(gpu[static_cast<size_t>(h) * T + b * c.S + i]) -
                                          cpu[(static_cast<size_t>(b) * c.Hq + h) * c.S + i]));
  return worst;
}

void expect_grads(const Grads& got, const Ref& want, const std::string& what) {
  test::expect_norm(got.dq, want.dq, 2e-2, 1e-2, what + " dq");
  test::expect_norm(got.dk, want.dk, 2e-2, 1e-2, what + " dk");
  test::expect_norm(got.dv, want.dv, 2e-2, 1e-2, what + " dv");
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const std::vector<MlaCase>& cpu_cases() {
  static const std::vector<MlaCase> cases = {
      {1, 256, 4, 4, 0, 0},                        // one document, two query tiles, one backward key tile x 2
      {1, 1024, 16, 16, 0, 0, kDsv3Scale},         // DeepSeek-V3's scale, 8 query tiles, 16 heads
      {1, 777, 8, 8, 1, 300},                      // packed documents, odd length (partial tiles)
      {2, 333, 4, 4, 1, 100},                      // two batch rows, odd length, packed documents
      {1, 517, 8, 2, 60, 200, kDsv3Scale},         // GQA 4:1 (the kernels take it; MLA itself is MHA)
      {1, 300, 4, 4, 1, 150, 0.0f, 100, true},     // a window and sinks
  };
  return cases;
}

// Forward (out [.., 128], lse) and both backward shapes in both modes against the CPU.
TEST(CudaFlashAttentionMla, MmaSyncMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  using M = cuda::FlashBwdMode;
  for (size_t i = 0; i < cpu_cases().size(); ++i) {
    const MlaCase& c = cpu_cases()[i];
    SCOPED_TRACE(name(c));
    const uint64_t seed = 4000 + 10 * i;
    const Inputs in = make_inputs(c, seed);
    const Ref want = cpu_reference(c, in);
    Dev d = to_device(c, in);
    forward(c, d, cuda::detail::FlashFwdKernel::MmaSync);
    EXPECT_EQ(d.out.shape(), (Shape{c.B, c.S, c.Hq, kDv})) << "out is q's shape with 128 columns";
    test::expect_norm(test::device_floats(d.out), want.out, 1e-2, 5e-3, "out");
    const double worst = lse_max_abs(c, test::device_floats(d.lse), want.lse);
    EXPECT_LE(worst, 1e-4) << "lse";
    if (std::getenv("MT_PRINT_ERRORS")) std::printf("[ error    ] lse: max abs %.3g (limit 1e-4)\n", worst);
    for (int slices : {1, 2})
      for (M mode : {M::fast, M::deterministic}) {
        const std::string what =
            std::to_string(slices) + (slices == 1 ? " slice " : " slices ") + (mode == M::fast ? "fast" : "det");
        const Grads g = backward(c, d, slices, mode);
        ASSERT_EQ(g.dv.size(), static_cast<size_t>(c.B) * c.S * c.Hk * kDv) << what;
        expect_grads(g, want, what);
      }
  }
}

// At a training shape (seq 2048, 16 heads, packed documents): the deterministic backward repeats bit for bit in
// both shapes; in one mode the two shapes form the same bf16 P and dS (the same Sᵀ, dPᵀ code per slice) and differ
// in fp32 summation order of dQ only: 1e-2 / 2e-3; fast against deterministic (whose dQ pass recomputes S and dP
// in another order, so a few bf16 roundings of P and dS differ) within the CPU tolerance, as
// DeterministicBackwardMatchesCpuAndRepeatsBitwise checks at equal dims.
TEST(CudaFlashAttentionMla, BackwardShapesAgreeAndDeterministicRepeats) {
  MT_SKIP_WITHOUT_CUDA();
  using M = cuda::FlashBwdMode;
  const MlaCase c{1, 2048, 16, 16, 1, 900, kDsv3Scale};
  const Inputs in = make_inputs(c, 4500);
  Dev d = to_device(c, in);
  forward(c, d, cuda::detail::FlashFwdKernel::MmaSync);
  const Grads det1 = backward(c, d, 1, M::deterministic), fast1 = backward(c, d, 1, M::fast);
  test::expect_norm(fast1.dq, det1.dq, 2e-2, 1e-2, "1 slice: fast vs det dq");
  test::expect_norm(fast1.dk, det1.dk, 2e-2, 1e-2, "1 slice: fast vs det dk");
  test::expect_norm(fast1.dv, det1.dv, 2e-2, 1e-2, "1 slice: fast vs det dv");
  for (int slices : {1, 2}) {
    const std::string s = std::to_string(slices) + (slices == 1 ? " slice" : " slices");
    const Grads a = backward(c, d, slices, M::deterministic), b = backward(c, d, slices, M::deterministic);
    EXPECT_TRUE(bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) && bitwise_equal(a.dv, b.dv))
        << s << ": the deterministic backward differs run to run";
    test::expect_norm(a.dq, det1.dq, 1e-2, 2e-3, s + " det vs 1-slice det dq");
    test::expect_norm(a.dk, det1.dk, 1e-2, 2e-3, s + " det vs 1-slice det dk");
    test::expect_norm(a.dv, det1.dv, 1e-2, 2e-3, s + " det vs 1-slice det dv");
    const Grads f = backward(c, d, slices, M::fast);
    test::expect_norm(f.dq, fast1.dq, 1e-2, 2e-3, s + " fast vs 1-slice fast dq");
    test::expect_norm(f.dk, fast1.dk, 1e-2, 2e-3, s + " fast vs 1-slice fast dk");
    test::expect_norm(f.dv, fast1.dv, 1e-2, 2e-3, s + " fast vs 1-slice fast dv");
  }
}

bool sm90_forward_runs_mla() {
  (void)stream0();  // makes device 0 current
  cuda::detail::FlashArgs a;
  a.T = 128, a.Hq = 1, a.Hk = 1, a.D = kDqk, a.Dv = kDv;
  return cuda::detail::flash_fwd_sm90_supported(a);
}

bool sm90_backward_runs_mla() {
  (void)stream0();  // makes device 0 current
  cuda::detail::FlashArgs a;
  a.T = 128, a.Hq = 1, a.Hk = 1, a.D = kDqk, a.Dv = kDv;
  return cuda::detail::flash_bwd_sm90_supported(a);
}

// The fast backward with `kind` (Sm90 forced, MmaSync in one column slice, or Auto) on the forward's out and lse.
Grads backward_with(const MlaCase& c, const Dev& d, cuda::detail::FlashBwdKernel kind) {
  cuda::detail::flash_bwd_kernel_set(kind);
  Tensor dq, dk, dv;
  try {
    cuda::flash_attention_backward(flash_shape(c), d.dout, d.q, d.k, d.v, d.out, d.lse, d.docs, dq, dk, dv, stream0(),
                                   nullptr, cuda::FlashBwdMode::fast, d.sinks);
  } catch (...) {
    cuda::detail::flash_bwd_kernel_set(cuda::detail::FlashBwdKernel::Auto);
    throw;
  }
  cuda::detail::flash_bwd_kernel_set(cuda::detail::FlashBwdKernel::Auto);
  return {test::device_floats(dq), test::device_floats(dk), test::device_floats(dv)};
}

// The Hopper forward at 192 / 128, forced: against the CPU on the cases above without a window or sinks (it has
// neither at this size), then against the mma.sync forward at the bench's size (seq 4096, 16 heads: one document,
// packed documents, and two rows of 1987: partial tiles past T). Every row sees itself: every lse is finite.
TEST(CudaFlashAttentionMla, Sm90ForwardMatchesCpuAndMmaSync) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_forward_runs_mla())
    GTEST_SKIP() << "the sm90 flash-attention forward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  using K = cuda::detail::FlashFwdKernel;
  for (size_t i = 0; i < cpu_cases().size(); ++i) {
    const MlaCase& c = cpu_cases()[i];
    if (c.window > 0 || c.sinks) continue;
    SCOPED_TRACE(name(c));
    const uint64_t seed = 4000 + 10 * i;
    const Inputs in = make_inputs(c, seed);
    cpu::AttentionShape cs{c.B, c.S, c.Hq, c.Hk, kDqk};
    cs.v_dim = kDv;
    cs.scale = c.scale;
    Tensor lse;
    const std::vector<float> want = cpu::attention_forward(cs, in.q, in.k, in.v, in.doc, true, lse).to_floats();
    Dev d = to_device(c, in);
    forward(c, d, K::Sm90);
    test::expect_norm(test::device_floats(d.out), want, 1e-2, 5e-3, "sm90 out");
    const double worst = lse_max_abs(c, test::device_floats(d.lse), lse.to_floats());
    EXPECT_LE(worst, 1e-4) << "sm90 lse";
  }
  for (const MlaCase& c : {MlaCase{1, 4096, 16, 16, 0, 0, kDsv3Scale}, MlaCase{1, 4096, 16, 16, 1, 1500},
                           MlaCase{2, 1987, 16, 16, 1, 700, kDsv3Scale}}) {
    SCOPED_TRACE("sm90 vs mma: " + name(c));
    Dev d = to_device(c, make_inputs(c, 4600 + c.S + c.max_doc));
    forward(c, d, K::Sm90);
    const std::vector<float> out_a = test::device_floats(d.out), lse_a = test::device_floats(d.lse);
    forward(c, d, K::MmaSync);
    const std::vector<float> out_b = test::device_floats(d.out), lse_b = test::device_floats(d.lse);
    test::expect_norm(out_a, out_b, 1e-2, 5e-3, "sm90 vs mma out");
    ASSERT_EQ(lse_a.size(), lse_b.size());
    double worst = 0;
    size_t non_finite = 0;
    for (size_t j = 0; j < lse_a.size(); ++j) {
      if (!std::isfinite(lse_a[j]) || !std::isfinite(lse_b[j]))
        ++non_finite;
      else
        worst = std::max(worst, std::fabs(double(lse_a[j]) - lse_b[j]));
    }
    EXPECT_EQ(non_finite, 0u);
    EXPECT_LE(worst, 1e-3) << "sm90 vs mma lse";
  }
}

// Auto takes the 192 / 128 sm90 forward unless MIXTUNE_FLASH_FWD_SM90_MLA=0 (read once per process): bitwise the
// forced sm90 result by default, the forced mma.sync result with it (run the test once each way).
TEST(CudaFlashAttentionMla, AutoTakesSm90ForwardUnlessOptedOut) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_forward_runs_mla())
    GTEST_SKIP() << "the sm90 flash-attention forward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  using K = cuda::detail::FlashFwdKernel;
  const MlaCase c{1, 700, 8, 8, 1, 300, kDsv3Scale};
  Dev d = to_device(c, make_inputs(c, 4700));
  forward(c, d, K::Auto);
  const std::vector<float> autos = test::device_floats(d.out);
  const char* e = std::getenv("MIXTUNE_FLASH_FWD_SM90_MLA");
  const char* fwd = std::getenv("MIXTUNE_FLASH_FWD");
  const bool sm90 = !(e && std::string(e) == "0") && !(fwd && std::string(fwd) == "mma");
  forward(c, d, sm90 ? K::Sm90 : K::MmaSync);
  EXPECT_TRUE(bitwise_equal(autos, test::device_floats(d.out)))
      << (sm90 ? "default: not the sm90 result" : "opted out: not the mma.sync result");
}

// The Hopper backward at 192 / 128, forced, against the CPU on the cases above without a window or sinks (it has
// neither), plus one item shorter than its 96 keys (T 67, MQA) and three rows of short documents; the mma.sync
// backward on the same inputs against the CPU too; on the GQA cases every heads-per-item G dividing the group (dK, dV
// of G query heads summed in registers before one flush). Then against the mma.sync backward at the bench's size
// (seq 4096, 16 heads: one document, packed documents, two rows of 1987: partial items and steps past T).
TEST(CudaFlashAttentionMla, Sm90BackwardMatchesCpuAndMmaSync) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_backward_runs_mla())
    GTEST_SKIP() << "the sm90 flash-attention backward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  using K = cuda::detail::FlashBwdKernel;
  std::vector<MlaCase> cases;
  for (const MlaCase& c : cpu_cases())
    if (c.window == 0 && !c.sinks) cases.push_back(c);
  cases.push_back({1, 67, 2, 1, 0, 0});
  cases.push_back({3, 171, 4, 4, 1, 45, kDsv3Scale});
  for (size_t i = 0; i < cases.size(); ++i) {
    const MlaCase& c = cases[i];
    SCOPED_TRACE(name(c));
    const Inputs in = make_inputs(c, 4800 + 10 * i);
    const Ref want = cpu_reference(c, in);
    Dev d = to_device(c, in);
    forward(c, d, cuda::detail::FlashFwdKernel::Auto);
    const Grads sm90 = backward_with(c, d, K::Sm90);
    ASSERT_EQ(sm90.dq.size(), static_cast<size_t>(c.B) * c.S * c.Hq * kDqk);
    ASSERT_EQ(sm90.dv.size(), static_cast<size_t>(c.B) * c.S * c.Hk * kDv);
    expect_grads(sm90, want, "sm90");
    expect_grads(backward_with(c, d, K::MmaSync), want, "mma");
    for (int g = 2; g <= c.Hq / c.Hk; g *= 2) {
      cuda::detail::flash_bwd_sm90_heads_set(g);
      const Grads got = backward_with(c, d, K::Sm90);
      cuda::detail::flash_bwd_sm90_heads_set(-1);
      expect_grads(got, want, "sm90 G " + std::to_string(g));
    }
  }
  for (const MlaCase& c : {MlaCase{1, 4096, 16, 16, 0, 0, kDsv3Scale}, MlaCase{1, 4096, 16, 16, 1, 1500},
                           MlaCase{2, 1987, 16, 16, 1, 700, kDsv3Scale}}) {
    SCOPED_TRACE("sm90 vs mma: " + name(c));
    Dev d = to_device(c, make_inputs(c, 4900 + c.S + c.max_doc));
    forward(c, d, cuda::detail::FlashFwdKernel::Auto);
    const Grads a = backward_with(c, d, K::Sm90), b = backward_with(c, d, K::MmaSync);
    test::expect_norm(a.dq, b.dq, 2e-2, 1e-2, "sm90 vs mma dq");
    test::expect_norm(a.dk, b.dk, 2e-2, 1e-2, "sm90 vs mma dk");
    test::expect_norm(a.dv, b.dv, 2e-2, 1e-2, "sm90 vs mma dv");
  }
}

// Auto runs the 192 / 128 sm90 backward unless MIXTUNE_FLASH_BWD_SM90_MLA=0 (read once per process; run the test
// once each way). Neither fast backward repeats bit for bit (fp32 atomics), so Auto's result is told apart by
// distance: the two kernels differ by about one bf16 rounding of P inside dS (dq, dk rel-L2 ~3e-3 at head_dim 128),
// a kernel against itself by the order of fp32 sums only (~1e-5); Auto's must lie within a quarter of the kernels'
// distance of the kernel it should have run.
TEST(CudaFlashAttentionMla, AutoTakesSm90BackwardUnlessOptedOut) {
  MT_SKIP_WITHOUT_CUDA();
  if (!sm90_backward_runs_mla())
    GTEST_SKIP() << "the sm90 flash-attention backward needs a cc 9.0 GPU and an sm_90a build (device 0 has neither)";
  using K = cuda::detail::FlashBwdKernel;
  const MlaCase c{1, 1024, 8, 8, 1, 500, kDsv3Scale};
  Dev d = to_device(c, make_inputs(c, 4950));
  forward(c, d, cuda::detail::FlashFwdKernel::Auto);
  const Grads autos = backward_with(c, d, K::Auto), sm90 = backward_with(c, d, K::Sm90),
              mma = backward_with(c, d, K::MmaSync);
  auto dist = [](const Grads& x, const Grads& y) {
    return test::error_stats(x.dq, y.dq).rel_l2 + test::error_stats(x.dk, y.dk).rel_l2;
  };
  const double apart = dist(sm90, mma);
  ASSERT_GT(apart, 1e-3) << "the two backwards agree too closely for this test to tell which one Auto ran";
  const char* e = std::getenv("MIXTUNE_FLASH_BWD_SM90_MLA");
  const char* bwd = std::getenv("MIXTUNE_FLASH_BWD");
  const bool sm90_expected = !(e && std::string(e) == "0") && !(bwd && std::string(bwd) == "mma");
  const double to_sm90 = dist(autos, sm90), to_mma = dist(autos, mma);
  if (sm90_expected)
    EXPECT_LT(to_sm90, apart / 4) << "default: Auto's gradients are not the sm90 backward's (to mma.sync " << to_mma
                                  << ", kernels apart " << apart << ")";
  else
    EXPECT_LT(to_mma, apart / 4) << "opted out: Auto's gradients are not the mma.sync backward's (to sm90 " << to_sm90
                                 << ", kernels apart " << apart << ")";
}

// The sm90 backward at 192 / 128 has no window or sinks: forcing it with either is an error naming them, before
// anything runs; under Auto (opted in or not) such calls run the mma.sync backward. Any softmax scale is taken.
TEST(CudaFlashAttentionMla, Sm90BackwardRefusesWindowAndSinks) {
  MT_SKIP_WITHOUT_CUDA();
  const MlaCase windowed{1, 300, 4, 4, 1, 150, kDsv3Scale, 100, false}, sinks{1, 300, 4, 4, 1, 150, 0.0f, 0, true};
  for (const MlaCase& c : {windowed, sinks}) {
    SCOPED_TRACE(name(c));
    const Inputs in = make_inputs(c, 5000);
    const Ref want = cpu_reference(c, in);
    Dev d = to_device(c, in);
    forward(c, d, cuda::detail::FlashFwdKernel::MmaSync);
    try {
      (void)backward_with(c, d, cuda::detail::FlashBwdKernel::Sm90);
      ADD_FAILURE() << "the sm90 backward accepted a window or sinks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the sm90 kernel has no sliding window, sinks"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("head_dim 192"), std::string::npos) << e.what();
    }
    expect_grads(backward_with(c, d, cuda::detail::FlashBwdKernel::Auto), want, "auto");
  }
}

// The shape contract: out allocated as q's shape with 128 columns (or [T, heads, 128] from a flat q); v, out,
// dout, a given out and dv checked against v_dim; unsupported pairs, a negative v_dim, the sm90 backward and the
// sm90 forward with a window are errors naming the sizes; nothing runs on the device for them.
TEST(CudaFlashAttentionMla, ShapesAndErrors) {
  MT_SKIP_WITHOUT_CUDA();
  const int T = 64, H = 2;
  cuda::AttentionDocs docs = cuda::attention_docs_from_ids(Tensor(), 1, T, 0, stream0());
  auto dev = [](const Shape& s, uint64_t seed) {
    return test::device_from_host(test::host_random(s, seed, 1.0f, true), DType::BF16);
  };
  const Tensor q = dev({T, H, kDqk}, 1), k = dev({T, H, kDqk}, 2), v = dev({T, H, kDv}, 3);
  cuda::FlashAttentionShape s{T, H, H, kDqk};
  s.v_dim = kDv;
  Tensor out, lse;
  cuda::flash_attention_forward(s, q, k, v, docs, out, lse, stream0());
  EXPECT_EQ(out.shape(), (Shape{T, H, kDv}));
  Tensor out_flat, lse2;
  cuda::flash_attention_forward(s, q.view({T, H * kDqk}), k, v, docs, out_flat, lse2, stream0());
  EXPECT_EQ(out_flat.shape(), (Shape{T, H, kDv})) << "a flat q: [T, heads, v_dim]";
  EXPECT_TRUE(bitwise_equal(test::device_floats(out), test::device_floats(out_flat)));

  Tensor o, l;
  EXPECT_THROW(cuda::flash_attention_forward(s, q, k, k, docs, o, l, stream0()), Error) << "v with 192 columns";
  cuda::FlashAttentionShape no_v = s;
  no_v.v_dim = 0;  // values as wide as the keys: no kernel for 192 / 192 (and v has the wrong size)
  EXPECT_THROW(cuda::flash_attention_forward(no_v, q, k, v, docs, o, l, stream0()), Error);
  cuda::FlashAttentionShape neg = s;
  neg.v_dim = -128;
  EXPECT_THROW(cuda::flash_attention_forward(neg, q, k, v, docs, o, l, stream0()), Error);
  cuda::FlashAttentionShape v64 = s;
  v64.v_dim = 64;
  const Tensor v_64 = dev({T, H, 64}, 4);
  try {
    cuda::flash_attention_forward(v64, q, k, v_64, docs, o, l, stream0());
    ADD_FAILURE() << "head_dim 192 with v_dim 64 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 192 with v_dim 64 (supported: 192 with v_dim 128)"),
              std::string::npos)
        << e.what();
  }
  Tensor wrong_out = Tensor::empty({T, H, kDqk}, DType::BF16, Device::cuda(0));
  Tensor l3;
  EXPECT_THROW(cuda::flash_attention_forward(s, q, k, v, docs, wrong_out, l3, stream0()), Error)
      << "a given out of q's size";

  const Tensor dout = dev({T, H, kDv}, 5);
  Tensor dq, dk, dv;
  cuda::flash_attention_backward(s, dout, q, k, v, out, lse, docs, dq, dk, dv, stream0());
  EXPECT_EQ(dq.shape(), q.shape());
  EXPECT_EQ(dk.shape(), k.shape());
  EXPECT_EQ(dv.shape(), v.shape());
  Tensor dq2, dk2, dv2;
  EXPECT_THROW(cuda::flash_attention_backward(s, dev({T, H, kDqk}, 6), q, k, v, out, lse, docs, dq2, dk2, dv2,
                                              stream0()),
               Error)
      << "dout of q's size";
  Tensor dv_wrong = Tensor::empty({T, H, kDqk}, DType::BF16, Device::cuda(0));
  Tensor dq3, dk3;
  EXPECT_THROW(cuda::flash_attention_backward(s, dout, q, k, v, out, lse, docs, dq3, dk3, dv_wrong, stream0()), Error)
      << "dv of k's size";
  if (!sm90_backward_runs_mla()) {
    cuda::detail::flash_bwd_kernel_set(cuda::detail::FlashBwdKernel::Sm90);
    Tensor a, b, c2;
    try {
      cuda::flash_attention_backward(s, dout, q, k, v, out, lse, docs, a, b, c2, stream0());
      ADD_FAILURE() << "the sm90 backward was forced on a device that does not run it";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs head_dim and v_dim 128, or head_dim 192 with v_dim 128 (got 192 / "
                                           "128), a cc 9.0 GPU"),
                std::string::npos)
          << e.what();
    }
    cuda::detail::flash_bwd_kernel_set(cuda::detail::FlashBwdKernel::Auto);
  }
  if (sm90_forward_runs_mla()) {
    cuda::detail::flash_fwd_kernel_set(cuda::detail::FlashFwdKernel::Sm90);
    cuda::FlashAttentionShape w = s;
    w.window = 16;
    Tensor a, b;
    EXPECT_THROW(cuda::flash_attention_forward(w, q, k, v, docs, a, b, stream0()), Error)
        << "the sm90 forward has no window at 192 / 128";
    cuda::detail::flash_fwd_kernel_set(cuda::detail::FlashFwdKernel::Auto);
  }
}

// No GPU needed: which head-size pairs the kernels take, and the backward-shape setting (forced 1 or 2; unset:
// MIXTUNE_FLASH_BWD_MLA_SLICES=2 selects 2, else 1).
TEST(CudaFlashAttentionMla, DimsAndBackwardShapeSetting) {
  EXPECT_TRUE(cuda::flash_attention_dims_supported(192, 128));
  EXPECT_TRUE(cuda::flash_attention_dims_supported(128, 128));
  EXPECT_TRUE(cuda::flash_attention_dims_supported(64, 64));
  EXPECT_FALSE(cuda::flash_attention_dims_supported(192, 192));
  EXPECT_FALSE(cuda::flash_attention_dims_supported(192, 64));
  EXPECT_FALSE(cuda::flash_attention_dims_supported(128, 192));
  EXPECT_FALSE(cuda::flash_attention_head_dim_supported(192)) << "192 only with 128-column values";
  cuda::detail::FlashArgs a;
  a.D = 192;
  EXPECT_EQ(cuda::detail::flash_value_dim(a), 192) << "Dv 0: the key size";
  a.Dv = 128;
  EXPECT_EQ(cuda::detail::flash_value_dim(a), 128);
  cuda::detail::flash_bwd_mla_slices_set(2);
  EXPECT_EQ(cuda::detail::flash_bwd_mla_slices(), 2);
  cuda::detail::flash_bwd_mla_slices_set(1);
  EXPECT_EQ(cuda::detail::flash_bwd_mla_slices(), 1);
  cuda::detail::flash_bwd_mla_slices_set(-1);
  const char* e = std::getenv("MIXTUNE_FLASH_BWD_MLA_SLICES");
  EXPECT_EQ(cuda::detail::flash_bwd_mla_slices(), e && std::string(e) == "2" ? 2 : 1);
}

}  // namespace
}  // namespace mt
