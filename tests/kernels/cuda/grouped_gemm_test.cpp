// CUDA grouped expert GEMM (forward, dgrad, K-grouped wgrad) against a double-precision host loop, with
// uneven and empty experts, partial tiles in every dimension, and rows past offsets[E] left untouched;
// then the whole routed-experts layer (plan, gather, two grouped GEMMs, combine and their backward)
// against cpu::experts_forward / experts_backward in bf16 mode.
//
// Thresholds: inputs are bf16 values, products accumulate in fp32 (tensor cores) and the bf16 outputs
// are rounded once, at most 2^-8 (3.9e-3) of an element: max-norm 6e-3, rel-L2 3e-3 (measured on an
// H200: up to 3.4e-3 and 1.7e-3). The fp32 wgrad only differs by summation order: 1e-5. The experts layer
// chains three bf16 roundings (gate/up, activation, down) whose rounding points match the CPU, but a
// different fp32 accumulation order can flip any of them: max-norm 1e-2, rel-L2 5e-3; its fp32 gradients
// pass through bf16 tensors on the GPU (dY, dgate_up, dX): max-norm 2e-2, rel-L2 1e-2 (measured: 3.6e-3
// and 1.7e-3 forward, at most 3.8e-3 and 3.3e-3 backward).
#include "kernels/cuda/grouped_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cpu/experts.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/grouped_gemm_kernels.h"
#include "kernels/cuda/moe_permute.h"

namespace mt {
namespace {

cudaStream_t stream0() { return cuda::device_context(0).stream; }

Tensor device_i32(const std::vector<int32_t>& v) {
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), h.data_as<int32_t>());
  return cuda::to_device(h, 0);
}

std::vector<int32_t> offsets_of(const std::vector<int>& counts) {
  std::vector<int32_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

struct GemmCase {
  std::vector<int> counts;  // rows per expert
  int extra_rows;           // rows past offsets[E] (must stay untouched)
  int nout, k;
};

TEST(CudaGroupedGemm, ForwardDgradWgradMatchDoubleReference) {
  MT_SKIP_WITHOUT_CUDA();
  // The mma.sync forward (Sm90ForwardMatchesDoubleReference covers the wgmma one, the default on cc 9.x).
  cuda::detail::grouped_gemm_fwd_kernel_set(cuda::detail::GroupedFwdKernel::MmaSync);
  struct Restore {
    ~Restore() { cuda::detail::grouped_gemm_fwd_kernel_set(cuda::detail::GroupedFwdKernel::Auto); }
  } restore;
  const GemmCase cases[] = {
      {{0, 1, 130, 0, 257, 64, 3}, 5, 200, 136},  // empty experts, partial m/n/k tiles
      {{128, 128}, 0, 128, 64},                   // exact tiles
      {{0, 0, 0}, 7, 64, 64},                     // no rows at all
      {{300, 17, 511, 1, 256, 0, 90, 129}, 0, 384, 264},
  };
  for (const GemmCase& c : cases) {
    const int E = static_cast<int>(c.counts.size()), Nout = c.nout, K = c.k;
    const std::vector<int32_t> off = offsets_of(c.counts);
    const int rows = off[E], N = rows + c.extra_rows;
    SCOPED_TRACE(testing::Message() << "E " << E << " rows " << rows << " Nout " << Nout << " K " << K);
    Tensor x = test::host_random({N, K}, 11, 1.0f, true), w = test::host_random({E, Nout, K}, 12, 0.05f, true);
    Tensor dy = test::host_random({N, Nout}, 13, 1.0f, true);
    std::vector<float> xv = x.to_floats(), wv = w.to_floats(), dyv = dy.to_floats();
    auto expert_of = [&](int r) {
      return static_cast<int>(std::upper_bound(off.begin(), off.end(), r) - off.begin()) - 1;
    };
    Tensor offsets = device_i32(off);

    // Forward: y[r][n] = Σ_k x[r][k] w[e][n][k]. Rows past offsets[E] keep their sentinel.
    std::vector<float> want_y(static_cast<size_t>(N) * Nout, 7.0f);
    for (int r = 0; r < rows; ++r) {
      const int e = expert_of(r);
      for (int n = 0; n < Nout; ++n) {
        double s = 0;
        for (int kk = 0; kk < K; ++kk) s += double(xv[r * K + kk]) * wv[(static_cast<size_t>(e) * Nout + n) * K + kk];
        want_y[r * Nout + n] = static_cast<float>(s);
      }
    }
    Tensor y = test::device_from_host(Tensor::from_floats({N, Nout}, std::vector<float>(N * Nout, 7.0f)), DType::BF16);
    cuda::grouped_gemm_forward(test::device_from_host(x, DType::BF16), test::device_from_host(w, DType::BF16), offsets,
                               y, stream0());
    std::vector<float> yv = test::device_floats(y);
    test::expect_norm(yv, want_y, 6e-3, 3e-3, "forward y");
    for (int r = rows; r < N; ++r) ASSERT_EQ(yv[r * Nout], 7.0f) << "row past offsets[E] was written";

    // Dgrad: dx[r][k] = Σ_n dy[r][n] w[e][n][k].
    std::vector<float> want_dx(static_cast<size_t>(N) * K, 7.0f);
    for (int r = 0; r < rows; ++r) {
      const int e = expert_of(r);
      for (int kk = 0; kk < K; ++kk) {
        double s = 0;
        for (int n = 0; n < Nout; ++n)
          s += double(dyv[r * Nout + n]) * wv[(static_cast<size_t>(e) * Nout + n) * K + kk];
        want_dx[r * K + kk] = static_cast<float>(s);
      }
    }
    Tensor dx = test::device_from_host(Tensor::from_floats({N, K}, std::vector<float>(N * K, 7.0f)), DType::BF16);
    cuda::grouped_gemm_dgrad(test::device_from_host(dy, DType::BF16), test::device_from_host(w, DType::BF16), offsets,
                             dx, stream0());
    test::expect_norm(test::device_floats(dx), want_dx, 6e-3, 3e-3, "dgrad dx");

    // Wgrad: dw[e][n][k] = Σ_{r of e} dy[r][n] x[r][k]; overwrite (empty experts -> 0), then accumulate.
    std::vector<float> want_dw(static_cast<size_t>(E) * Nout * K, 0.0f);
    for (int e = 0; e < E; ++e)
      for (int n = 0; n < Nout; ++n)
        for (int kk = 0; kk < K; ++kk) {
          double s = 0;
          for (int r = off[e]; r < off[e + 1]; ++r) s += double(dyv[r * Nout + n]) * xv[r * K + kk];
          want_dw[(static_cast<size_t>(e) * Nout + n) * K + kk] = static_cast<float>(s);
        }
    Tensor start = test::host_random({E, Nout, K}, 14);
    Tensor dw = cuda::to_device(start, 0);
    cuda::grouped_gemm_wgrad(test::device_from_host(dy, DType::BF16), test::device_from_host(x, DType::BF16), offsets,
                             dw, false, stream0());
    test::expect_norm(test::device_floats(dw), want_dw, 1e-5, 1e-5, "wgrad (overwrite)");
    std::vector<float> sv = start.to_floats(), want_acc(want_dw.size());
    for (size_t i = 0; i < want_dw.size(); ++i) want_acc[i] = want_dw[i] + sv[i];
    Tensor dw2 = cuda::to_device(start, 0);
    cuda::grouped_gemm_wgrad(test::device_from_host(dy, DType::BF16), test::device_from_host(x, DType::BF16), offsets,
                             dw2, true, stream0());
    test::expect_norm(test::device_floats(dw2), want_acc, 1e-5, 1e-5, "wgrad (accumulate)");
    // BF16 dw (pure-bf16 gradients): the fp32 sum plus the bf16 start, rounded once: within one bf16
    // rounding (2^-9 relative) of the exact value.
    Tensor start16 = test::host_random({E, Nout, K}, 14, 1.0f, /*bf16_values=*/true);
    std::vector<float> s16 = start16.to_floats(), want16(want_dw.size());
    for (size_t i = 0; i < want_dw.size(); ++i) want16[i] = want_dw[i] + s16[i];
    Tensor dw3 = test::device_from_host(start16, DType::BF16);
    cuda::grouped_gemm_wgrad(test::device_from_host(dy, DType::BF16), test::device_from_host(x, DType::BF16), offsets,
                             dw3, true, stream0());
    test::expect_norm(test::device_floats(dw3), want16, 4e-3, 3e-3, "wgrad (bf16 accumulate)");
  }
}

// Σ_k a[k]·b[k] in double, four independent sums (the reference loops below are large).
double dot_double(const float* a, const float* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += double(a[k]) * b[k];
    s1 += double(a[k + 1]) * b[k + 1];
    s2 += double(a[k + 2]) * b[k + 2];
    s3 += double(a[k + 3]) * b[k + 3];
  }
  for (; k < n; ++k) s0 += double(a[k]) * b[k];
  return (s0 + s1) + (s2 + s3);
}

// Runs grouped_gemm_forward on one kernel for the scope, then back to Auto.
struct ForwardKernelScope {
  explicit ForwardKernelScope(cuda::detail::GroupedFwdKernel k) { cuda::detail::grouped_gemm_fwd_kernel_set(k); }
  ~ForwardKernelScope() { cuda::detail::grouped_gemm_fwd_kernel_set(cuda::detail::GroupedFwdKernel::Auto); }
};

// The wgmma kernels' tests: skipped on GPUs other than cc 9.x; a cc 9.x GPU without an sm_90a build fails.
#define MT_SKIP_WITHOUT_SM90()                                                                              \
  do {                                                                                                      \
    MT_SKIP_WITHOUT_CUDA();                                                                                 \
    const cuda::DeviceContext& sm90_ctx = cuda::device_context(0);                                          \
    if (sm90_ctx.cc_major != 9)                                                                             \
      GTEST_SKIP() << "the wgmma kernels need cc 9.x; device is " << sm90_ctx.cc_major << "." << sm90_ctx.cc_minor; \
    ASSERT_TRUE(cuda::detail::grouped_gemm_sm90_compiled()) << "cc 9.x device but no sm_90a build of the kernels"; \
  } while (0)

// An M-grouped product's output [N][width]: the rows of the experts near `want`, the rows past offsets[E]
// still holding the 7.0 sentinel they were filled with.
void expect_grouped_rows(const std::vector<float>& got, const std::vector<float>& want, int rows, int N, int width,
                         const char* what) {
  if (rows > 0) test::expect_norm(got, want, 6e-3, 3e-3, what);
  for (int r = rows; r < N; ++r)
    for (int c = 0; c < width; ++c)
      ASSERT_EQ(got[static_cast<size_t>(r) * width + c], 7.0f) << what << ": row " << r << " past offsets[E] was written";
}

// The Hopper forward (TMA + wgmma, grouped_gemm_sm90.cu) against the double-precision loop: uneven,
// single-row and empty experts (tiles whose rows run into the next expert or past the tensor), Nout
// not a multiple of the 128/256 column tile (both tile widths are picked: 384 and 640 take 128),
// K below one 64-wide k-step and not a multiple of it, and the Qwen3-30B-A3B expert shapes
// (gate_up: K 2048 -> 1536, down: K 768 -> 2048). Same thresholds as the mma.sync forward.
const GemmCase kSm90Cases[] = {
    {{0, 1, 130, 0, 257, 64, 3}, 5, 200, 136},
    {{128, 128}, 0, 128, 64},
    {{0, 0, 0}, 7, 64, 64},
    {{300, 17, 511, 1, 256, 0, 90, 129}, 0, 384, 264},
    {{5, 70, 0, 133}, 2, 136, 8},        // K = 8: one k-step (forward), mostly zero fill
    {{3, 200}, 1, 8, 40},                // Nout = 8: one k-step (dgrad)
    {{129, 0, 1, 7, 250}, 3, 640, 256},  // Nout 640: 128-wide column tiles (forward)
    {{1, 7, 129, 0, 1000, 255, 0, 64}, 3, 1536, 2048},
    {{1, 7, 129, 0, 700, 900, 0, 383, 128}, 0, 2048, 768},
    // An expert's last 64-row slab holding every count of rows around 1, 16, 32, 48 and 63 (the slab's
    // rows past its expert are computed from the next expert's rows and must not be stored): the 256-wide
    // tile (Nout / K 512) and the 128-wide one (384).
    {{1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 79, 80, 96, 97, 112, 113, 127, 300}, 1, 512, 512},
    {{1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 79, 80, 96, 97, 112, 113, 127, 300}, 2, 384, 384},
};

void expect_sm90_forward_matches(const GemmCase& c) {
  const int E = static_cast<int>(c.counts.size()), Nout = c.nout, K = c.k;
  const std::vector<int32_t> off = offsets_of(c.counts);
  const int rows = off[E], N = rows + c.extra_rows;
  SCOPED_TRACE(testing::Message() << "E " << E << " rows " << rows << " Nout " << Nout << " K " << K);
  Tensor x = test::host_random({N, K}, 31, 1.0f, true), w = test::host_random({E, Nout, K}, 32, 0.05f, true);
  std::vector<float> xv = x.to_floats(), wv = w.to_floats();
  std::vector<float> want(static_cast<size_t>(N) * Nout, 7.0f);
  for (int e = 0; e < E; ++e)
    for (int r = off[e]; r < off[e + 1]; ++r)
      for (int n = 0; n < Nout; ++n)
        want[static_cast<size_t>(r) * Nout + n] = static_cast<float>(
            dot_double(&xv[static_cast<size_t>(r) * K], &wv[(static_cast<size_t>(e) * Nout + n) * K], K));
  Tensor y = test::device_from_host(Tensor::from_floats({N, Nout}, std::vector<float>(size_t(N) * Nout, 7.0f)),
                                    DType::BF16);
  cuda::grouped_gemm_forward(test::device_from_host(x, DType::BF16), test::device_from_host(w, DType::BF16),
                             device_i32(off), y, stream0());
  expect_grouped_rows(test::device_floats(y), want, rows, N, Nout, "wgmma forward y");
}

TEST(CudaGroupedGemm, Sm90ForwardMatchesDoubleReference) {
  MT_SKIP_WITHOUT_SM90();
  ForwardKernelScope scope(cuda::detail::GroupedFwdKernel::Wgmma);
  for (const GemmCase& c : kSm90Cases) expect_sm90_forward_matches(c);
}


// Layout probe of the wgmma kernel (a failure says which element it read): one expert, 128 rows,
// Nout 256, K 64 (one stage), x one-hot (x[r][k] = 1 where k = r % 64), so y[r][n] = W[n][r % 64].
// Run 1 has W[n][k] = k + 1, run 2 W[n][k] = n + 1 (exact in bf16): a wrong output gives the k and
// the n the kernel actually used for it (descriptor, swizzle or fragment mapping errors).
TEST(CudaGroupedGemm, Sm90ForwardLayoutProbe) {
  MT_SKIP_WITHOUT_SM90();
  ForwardKernelScope scope(cuda::detail::GroupedFwdKernel::Wgmma);
  const int R = 128, Nout = 256, K = 64;
  std::vector<float> xv(static_cast<size_t>(R) * K, 0.0f), wk(static_cast<size_t>(Nout) * K), wn(wk.size());
  for (int r = 0; r < R; ++r) xv[static_cast<size_t>(r) * K + r % K] = 1.0f;
  for (int n = 0; n < Nout; ++n)
    for (int k = 0; k < K; ++k) {
      wk[static_cast<size_t>(n) * K + k] = float(k + 1);
      wn[static_cast<size_t>(n) * K + k] = float(n + 1);
    }
  Tensor x = test::device_from_host(Tensor::from_floats({R, K}, xv), DType::BF16);
  Tensor offsets = device_i32({0, R});
  auto run = [&](const std::vector<float>& w) {
    Tensor y = Tensor::empty({R, Nout}, DType::BF16, Device::cuda(0));
    cuda::grouped_gemm_forward(x, test::device_from_host(Tensor::from_floats({1, Nout, K}, w), DType::BF16), offsets,
                               y, stream0());
    return test::device_floats(y);
  };
  const std::vector<float> yk = run(wk), yn = run(wn);
  int bad = 0;
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < Nout; ++n) {
      const size_t i = static_cast<size_t>(r) * Nout + n;
      if (yk[i] == float(r % K + 1) && yn[i] == float(n + 1)) continue;
      if (++bad <= 24)
        ADD_FAILURE() << "y[" << r << "][" << n << "]: read k " << yk[i] - 1 << " (want " << r % K << "), n "
                      << yn[i] - 1 << " (want " << n << ")";
    }
  EXPECT_EQ(bad, 0) << "outputs whose (n, k) are wrong, of " << R * Nout;
}

// The Hopper dgrad (the same kernel with W read as an N-major B: dx [rows][K] = dy [rows][Nout] · W_e)
// against the double-precision loop, on the forward's cases: output widths K of 136 (partial 128-wide
// tile), 264, 640 (128-wide tiles), 2048 and 768 (the Qwen3-30B-A3B gate_up and down dgrads), reduction
// Nout below one k-step (8) and not a multiple of it (200, 136). Same thresholds.
void expect_sm90_dgrad_matches(const GemmCase& c) {
  const int E = static_cast<int>(c.counts.size()), Nout = c.nout, K = c.k;
  const std::vector<int32_t> off = offsets_of(c.counts);
  const int rows = off[E], N = rows + c.extra_rows;
  SCOPED_TRACE(testing::Message() << "E " << E << " rows " << rows << " Nout " << Nout << " K " << K);
  Tensor dy = test::host_random({N, Nout}, 41, 1.0f, true), w = test::host_random({E, Nout, K}, 42, 0.05f, true);
  std::vector<float> dyv = dy.to_floats(), wv = w.to_floats();
  std::vector<float> wt(wv.size());  // W_eᵀ [E][K][Nout], so each output is one contiguous dot product
  for (int e = 0; e < E; ++e)
    for (int n = 0; n < Nout; ++n)
      for (int k = 0; k < K; ++k)
        wt[(static_cast<size_t>(e) * K + k) * Nout + n] = wv[(static_cast<size_t>(e) * Nout + n) * K + k];
  std::vector<float> want(static_cast<size_t>(N) * K, 7.0f);
  for (int e = 0; e < E; ++e)
    for (int r = off[e]; r < off[e + 1]; ++r)
      for (int k = 0; k < K; ++k)
        want[static_cast<size_t>(r) * K + k] = static_cast<float>(
            dot_double(&dyv[static_cast<size_t>(r) * Nout], &wt[(static_cast<size_t>(e) * K + k) * Nout], Nout));
  Tensor dx =
      test::device_from_host(Tensor::from_floats({N, K}, std::vector<float>(size_t(N) * K, 7.0f)), DType::BF16);
  cuda::grouped_gemm_dgrad(test::device_from_host(dy, DType::BF16), test::device_from_host(w, DType::BF16),
                           device_i32(off), dx, stream0());
  expect_grouped_rows(test::device_floats(dx), want, rows, N, K, "wgmma dgrad dx");
}

TEST(CudaGroupedGemm, Sm90DgradMatchesDoubleReference) {
  MT_SKIP_WITHOUT_SM90();
  ForwardKernelScope scope(cuda::detail::GroupedFwdKernel::Wgmma);
  for (const GemmCase& c : kSm90Cases) expect_sm90_dgrad_matches(c);
}

// Forward and dgrad on the 256-wide tile with 3 stages (what E in the thousands gets; the bench's probe
// forces it here) on the same cases, with the 4-stage default by the probe's explicit choice, and the forward
// on the probe's 128 x 384 tile.
TEST(CudaGroupedGemm, Sm90ProbeTilesMatchDoubleReference) {
  MT_SKIP_WITHOUT_SM90();
  ForwardKernelScope scope(cuda::detail::GroupedFwdKernel::Wgmma);
  struct ProbeScope {
    explicit ProbeScope(int stages, int bn = 0) { cuda::detail::grouped_gemm_sm90_probe_set({stages, true, true, bn}); }
    ~ProbeScope() { cuda::detail::grouped_gemm_sm90_probe_set({}); }
  };
  for (int stages : {3, 4}) {
    SCOPED_TRACE(testing::Message() << stages << " stages");
    ProbeScope probe(stages);
    for (const GemmCase& c : kSm90Cases) {
      expect_sm90_forward_matches(c);
      expect_sm90_dgrad_matches(c);
    }
  }
  // The bench's 128 x 384 tile (two m64n192k16 per k16; the forward's W in two 192-row boxes, the dgrad's in six
  // 64-column boxes).
  SCOPED_TRACE("384-wide tile");
  ProbeScope probe(0, 384);
  for (const GemmCase& c : kSm90Cases) {
    expect_sm90_forward_matches(c);
    expect_sm90_dgrad_matches(c);
  }
}

// The claimed-tile schedule (the producer takes each next tile from a counter and hands it to the consumers and
// storer warps through a ring): every sm90 case, forward and dgrad, the 128- and 256-wide tiles and the 3-stage
// fallback (the 3,000-expert case) among them.
TEST(CudaGroupedGemm, Sm90DynamicScheduleMatchesDoubleReference) {
  MT_SKIP_WITHOUT_SM90();
  ForwardKernelScope scope(cuda::detail::GroupedFwdKernel::Wgmma);
  struct DynamicScope {
    DynamicScope() { cuda::detail::grouped_gemm_sm90_dynamic_set(1); }
    ~DynamicScope() { cuda::detail::grouped_gemm_sm90_dynamic_set(-1); }
  } dynamic;
  ASSERT_TRUE(cuda::detail::grouped_gemm_sm90_dynamic());
  for (const GemmCase& c : kSm90Cases) {
    expect_sm90_forward_matches(c);
    expect_sm90_dgrad_matches(c);
  }
  std::vector<int> counts(3000);  // 3 stages: the experts' offsets leave no room for 4
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = static_cast<int>((e * 7) % 4);
  expect_sm90_forward_matches({counts, 2, 256, 64});
  expect_sm90_dgrad_matches({counts, 2, 64, 256});
}

// Layout probe of the wgmma dgrad (N-major B): one expert, 128 rows, reduction Nout 64, output K 256,
// dy one-hot (dy[r][j] = 1 where j = r % 64), so dx[r][k] = W[r % 64][k]. Run 1 has W[j][k] = j + 1,
// run 2 W[j][k] = k + 1: a wrong output names the reduction row and the column the kernel used.
TEST(CudaGroupedGemm, Sm90DgradLayoutProbe) {
  MT_SKIP_WITHOUT_SM90();
  ForwardKernelScope scope(cuda::detail::GroupedFwdKernel::Wgmma);
  const int R = 128, J = 64, K = 256;
  std::vector<float> dyv(static_cast<size_t>(R) * J, 0.0f), wj(static_cast<size_t>(J) * K), wk(wj.size());
  for (int r = 0; r < R; ++r) dyv[static_cast<size_t>(r) * J + r % J] = 1.0f;
  for (int j = 0; j < J; ++j)
    for (int k = 0; k < K; ++k) {
      wj[static_cast<size_t>(j) * K + k] = float(j + 1);
      wk[static_cast<size_t>(j) * K + k] = float(k + 1);
    }
  Tensor dy = test::device_from_host(Tensor::from_floats({R, J}, dyv), DType::BF16);
  Tensor offsets = device_i32({0, R});
  auto run = [&](const std::vector<float>& w) {
    Tensor dx = Tensor::empty({R, K}, DType::BF16, Device::cuda(0));
    cuda::grouped_gemm_dgrad(dy, test::device_from_host(Tensor::from_floats({1, J, K}, w), DType::BF16), offsets, dx,
                             stream0());
    return test::device_floats(dx);
  };
  const std::vector<float> dj = run(wj), dk = run(wk);
  int bad = 0;
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(r) * K + k;
      if (dj[i] == float(r % J + 1) && dk[i] == float(k + 1)) continue;
      if (++bad <= 24)
        ADD_FAILURE() << "dx[" << r << "][" << k << "]: read row " << dj[i] - 1 << " (want " << r % J << "), column "
                      << dk[i] - 1 << " (want " << k << ")";
    }
  EXPECT_EQ(bad, 0) << "outputs whose (row, column) are wrong, of " << R * K;
}

// The Hopper wgrad (K-grouped: dyᵀ and x both MN-major in shared memory, rows past an expert's end zeroed
// in the stage) against the double-precision sums, on the forward's cases (M = Nout, N = K): experts of
// 0, 1, 3, 17, 64, 129, 1000 rows (k-steps of 64 with partial last steps), M and N not multiples of the
// tiles, the Qwen3-30B-A3B shapes. Overwrite (empty experts -> zeros) and accumulate into F32 dW
// (summation order only: 1e-5), overwrite and accumulate into BF16 dW: the kernel rounds its fp32 sum to
// bf16 and TMA adds it in bf16 (two roundings, as Transformers accumulates bf16 gradients): each within
// half an ulp (2^-9) of its operand, so up to ~2 x 2^-9 of the largest value: max-norm 8e-3, rel-L2 3e-3.
void expect_sm90_wgrad_matches(const GemmCase& c) {
  const int E = static_cast<int>(c.counts.size()), Nout = c.nout, K = c.k;
  const std::vector<int32_t> off = offsets_of(c.counts);
  const int rows = off[E], N = rows + c.extra_rows;
  SCOPED_TRACE(testing::Message() << "E " << E << " rows " << rows << " Nout " << Nout << " K " << K);
  Tensor dy = test::host_random({N, Nout}, 51, 1.0f, true), x = test::host_random({N, K}, 52, 1.0f, true);
  std::vector<float> dyv = dy.to_floats(), xv = x.to_floats();
  std::vector<float> dyt(static_cast<size_t>(Nout) * N), xt(static_cast<size_t>(K) * N);  // column-major copies
  for (int r = 0; r < N; ++r) {
    for (int n = 0; n < Nout; ++n) dyt[static_cast<size_t>(n) * N + r] = dyv[static_cast<size_t>(r) * Nout + n];
    for (int k = 0; k < K; ++k) xt[static_cast<size_t>(k) * N + r] = xv[static_cast<size_t>(r) * K + k];
  }
  std::vector<float> want(static_cast<size_t>(E) * Nout * K);
  for (int e = 0; e < E; ++e)
    for (int n = 0; n < Nout; ++n)
      for (int k = 0; k < K; ++k)
        want[(static_cast<size_t>(e) * Nout + n) * K + k] = static_cast<float>(
            dot_double(&dyt[static_cast<size_t>(n) * N + off[e]], &xt[static_cast<size_t>(k) * N + off[e]],
                       off[e + 1] - off[e]));
  Tensor offsets = device_i32(off), ddy = test::device_from_host(dy, DType::BF16);
  Tensor dx = test::device_from_host(x, DType::BF16);
  Tensor start = test::host_random({E, Nout, K}, 53, 1.0f, /*bf16_values=*/true);
  const std::vector<float> sv = start.to_floats();
  std::vector<float> want_acc(want.size());
  for (size_t i = 0; i < want.size(); ++i) want_acc[i] = want[i] + sv[i];

  Tensor dw = cuda::to_device(start, 0);
  cuda::grouped_gemm_wgrad(ddy, dx, offsets, dw, /*accumulate=*/false, stream0());
  test::expect_norm(test::device_floats(dw), want, 1e-5, 1e-5, "wgmma wgrad (overwrite)");
  Tensor dw2 = cuda::to_device(start, 0);
  cuda::grouped_gemm_wgrad(ddy, dx, offsets, dw2, /*accumulate=*/true, stream0());
  test::expect_norm(test::device_floats(dw2), want_acc, 1e-5, 1e-5, "wgmma wgrad (accumulate)");
  Tensor dw3 = test::device_from_host(start, DType::BF16);
  cuda::grouped_gemm_wgrad(ddy, dx, offsets, dw3, /*accumulate=*/true, stream0());
  test::expect_norm(test::device_floats(dw3), want_acc, 8e-3, 3e-3, "wgmma wgrad (bf16 accumulate)");
  Tensor dw4 = test::device_from_host(start, DType::BF16);
  cuda::grouped_gemm_wgrad(ddy, dx, offsets, dw4, /*accumulate=*/false, stream0());
  test::expect_norm(test::device_floats(dw4), want, 4e-3, 3e-3, "wgmma wgrad (bf16 overwrite)");
}

TEST(CudaGroupedGemm, Sm90WgradMatchesDoubleReference) {
  MT_SKIP_WITHOUT_SM90();
  ForwardKernelScope scope(cuda::detail::GroupedFwdKernel::Wgmma);
  for (const GemmCase& c : kSm90Cases) {
    if (static_cast<int64_t>(c.counts.size()) * c.nout * c.k > (int64_t{1} << 26)) continue;  // host too slow
    expect_sm90_wgrad_matches(c);
  }
}

// With thousands of experts the offsets take the shared memory of a pipeline stage: the forward and dgrad
// fall back to 3 stages of the 256-wide tile, the wgrad to two staging buffers per consumer warpgroup
// (rounds of two chunks, the buffers reused within a tile). 3000 experts of 0-3 rows, widths
// that pick 256-wide tiles when there is room.
TEST(CudaGroupedGemm, Sm90WithThousandsOfExperts) {
  MT_SKIP_WITHOUT_SM90();
  ForwardKernelScope scope(cuda::detail::GroupedFwdKernel::Wgmma);
  std::vector<int> counts(3000);
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = static_cast<int>((e * 7) % 4);
  expect_sm90_forward_matches({counts, 2, 256, 64});  // output width Nout = 256
  expect_sm90_dgrad_matches({counts, 2, 64, 256});    // output width K = 256
  expect_sm90_wgrad_matches({counts, 2, 64, 256});
}

TEST(CudaGroupedGemm, BadShapesAreErrors) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor off = device_i32({0, 4, 8});
  Tensor x = Tensor::empty({8, 12}, DType::BF16, Device::cuda(0));  // K = 12: not a multiple of 8
  Tensor w = Tensor::empty({2, 16, 12}, DType::BF16, Device::cuda(0));
  Tensor y = Tensor::empty({8, 16}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::grouped_gemm_forward(x, w, off, y, stream0()), Error);
  Tensor x2 = Tensor::empty({8, 16}, DType::BF16, Device::cuda(0));
  Tensor w3 = Tensor::empty({3, 16, 16}, DType::BF16, Device::cuda(0));  // 3 experts, offsets for 2
  EXPECT_THROW(cuda::grouped_gemm_forward(x2, w3, off, y, stream0()), Error);
  Tensor wf = Tensor::empty({2, 16, 16}, DType::F32, Device::cuda(0));  // fp32 weights
  EXPECT_THROW(cuda::grouped_gemm_forward(x2, wf, off, y, stream0()), Error);
}

// The routed-experts layer on the GPU kernels vs cpu::experts_forward/backward (bf16 mode). The SwiGLU
// between the GEMMs is done on the host with the CPU op (same rounding points), so this test checks the
// layout contract between plan, gather, grouped GEMM and combine end to end.
TEST(CudaGroupedGemm, ExpertsLayerMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const int T = 200, k = 4, E = 12, H = 64, I = 48, N = T * k;
  std::mt19937_64 g(3);
  std::vector<int32_t> idx(N);
  for (int t = 0; t < T; ++t) {
    std::vector<int> p(E - 2);  // experts 10 and 11 never chosen
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), g);
    for (int s = 0; s < k; ++s) idx[t * k + s] = p[s];
  }
  Tensor index = Tensor::empty({T, k}, DType::I32);
  std::copy(idx.begin(), idx.end(), index.data_as<int32_t>());
  Tensor x = test::host_random({T, H}, 21, 1.0f, true);
  Tensor wts = test::host_random({T, k}, 22, 0.3f, true);
  Tensor gate_up = test::host_random({E, 2 * I, H}, 23, 0.1f, true);
  Tensor down = test::host_random({E, H, I}, 24, 0.1f, true);

  cpu::ExpertsSaved saved;
  Tensor want = cpu::experts_forward(x, index, wts, gate_up, down, true, &saved);

  cuda::MoePlan plan = cuda::moe_plan(cuda::to_device(index, 0), E, stream0());
  Tensor xg = cuda::moe_gather(test::device_from_host(x, DType::BF16), plan, stream0());
  Tensor gu_w = test::device_from_host(gate_up, DType::BF16), dn_w = test::device_from_host(down, DType::BF16);
  Tensor gu = Tensor::empty({N, 2 * I}, DType::BF16, Device::cuda(0));
  cuda::grouped_gemm_forward(xg, gu_w, plan.offsets, gu, stream0());
  // SwiGLU on the host, as cpu::experts_forward does it (bf16: silu rounded, product rounded).
  Tensor gu_h = cuda::to_host(gu).to(DType::F32);
  Tensor act_h = Tensor::empty({N, I}, DType::F32);
  cpu::swiglu_forward_rows(N, I, gu_h.data_as<float>(), gu_h.data_as<float>() + I, 2 * I, act_h.data_as<float>(), I,
                           true);
  Tensor act = test::device_from_host(act_h, DType::BF16);
  Tensor yg = Tensor::empty({N, H}, DType::BF16, Device::cuda(0));
  cuda::grouped_gemm_forward(act, dn_w, plan.offsets, yg, stream0());
  Tensor out = Tensor::empty({T, H}, DType::F32, Device::cuda(0));
  Tensor wts_dev = cuda::to_device(wts, 0);
  cuda::moe_combine(yg, wts_dev, plan, out, stream0());
  test::expect_norm(test::device_floats(out), want.to_floats(), 1e-2, 5e-3, "experts out");

  // Backward.
  Tensor dout = test::host_random({T, H}, 25, 1.0f, true);
  Tensor want_dx, want_dw;
  Tensor want_dgu = Tensor::zeros({E, 2 * I, H}, DType::F32), want_ddn = Tensor::zeros({E, H, I}, DType::F32);
  cpu::experts_backward(dout, wts, gate_up, down, saved, want_dx, want_dw, want_dgu, want_ddn);

  Tensor dy = Tensor::empty({N, H}, DType::BF16, Device::cuda(0));
  Tensor dwts = Tensor::empty({T, k}, DType::F32, Device::cuda(0));
  cuda::moe_combine_backward(test::device_from_host(dout, DType::BF16), yg, wts_dev, plan, dy, dwts, stream0());
  Tensor dact = Tensor::empty({N, I}, DType::BF16, Device::cuda(0));
  cuda::grouped_gemm_dgrad(dy, dn_w, plan.offsets, dact, stream0());
  Tensor ddn = Tensor::empty({E, H, I}, DType::F32, Device::cuda(0));
  cuda::grouped_gemm_wgrad(dy, act, plan.offsets, ddn, false, stream0());
  Tensor dact_h = cuda::to_host(dact).to(DType::F32);
  Tensor dgu_h = Tensor::empty({N, 2 * I}, DType::F32);
  cpu::swiglu_backward_rows(N, I, dact_h.data_as<float>(), I, gu_h.data_as<float>(), gu_h.data_as<float>() + I, 2 * I,
                            dgu_h.data_as<float>(), dgu_h.data_as<float>() + I, 2 * I);
  Tensor dgu = test::device_from_host(dgu_h, DType::BF16);
  Tensor dxg = Tensor::empty({N, H}, DType::BF16, Device::cuda(0));
  cuda::grouped_gemm_dgrad(dgu, gu_w, plan.offsets, dxg, stream0());
  Tensor dguw = Tensor::empty({E, 2 * I, H}, DType::F32, Device::cuda(0));
  cuda::grouped_gemm_wgrad(dgu, xg, plan.offsets, dguw, false, stream0());
  Tensor dx = Tensor::empty({T, H}, DType::F32, Device::cuda(0));
  cuda::moe_gather_backward(dxg, plan, dx, stream0());

  test::expect_norm(test::device_floats(dwts), want_dw.to_floats(), 2e-2, 1e-2, "dweights");
  test::expect_norm(test::device_floats(dx), want_dx.to_floats(), 2e-2, 1e-2, "dx");
  test::expect_norm(test::device_floats(ddn), want_ddn.to_floats(), 2e-2, 1e-2, "ddown");
  test::expect_norm(test::device_floats(dguw), want_dgu.to_floats(), 2e-2, 1e-2, "dgate_up");
  // Experts 10 and 11 received no tokens: their gradients are exactly zero.
  std::vector<float> dg = test::device_floats(dguw);
  for (size_t i = static_cast<size_t>(10) * 2 * I * H; i < dg.size(); ++i) ASSERT_EQ(dg[i], 0.0f);
}

}  // namespace
}  // namespace mt
