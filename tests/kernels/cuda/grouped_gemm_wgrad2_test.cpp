// The two-segment wgrad (two micro-batches reduced in one dW pass) against a double-precision host sum of
// both segments' products plus the starting dW: F32 dW (summation order only: 1e-5) and BF16 dW (one
// rounding of the fp32 sum: max-norm 4e-3, rel-L2 3e-3; the wgmma kernel rounds the sum to bf16 and adds
// it in bf16 through TMA, two roundings: max-norm 8e-3), segments with different expert counts, empty
// experts in one segment or both. Run on the mma.sync kernel and, on a cc 9.x GPU, on the wgmma one.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm_kernels.h"

namespace mt {
namespace {

Tensor device_offsets(const std::vector<int>& counts) {
  Tensor h = Tensor::empty({static_cast<int64_t>(counts.size()) + 1}, DType::I32);
  int32_t* p = h.data_as<int32_t>();
  p[0] = 0;
  for (size_t e = 0; e < counts.size(); ++e) p[e + 1] = p[e] + counts[e];
  return cuda::to_device(h, 0);
}

// dw[e][n][k] += Σ_{r of e} dy[r][n] x[r][k] for one segment.
void add_segment(std::vector<double>& dw, const std::vector<int>& counts, const std::vector<float>& dy,
                 const std::vector<float>& x, int Nout, int K) {
  int r0 = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int n = 0; n < Nout; ++n)
      for (int k = 0; k < K; ++k) {
        double s = 0;
        for (int r = r0; r < r0 + counts[e]; ++r) s += double(dy[r * Nout + n]) * x[r * K + k];
        dw[(e * Nout + n) * K + k] += s;
      }
    r0 += counts[e];
  }
}

TEST(CudaGroupedGemm, WgradOfTwoSegmentsMatchesSumOfBoth) {
  MT_SKIP_WITHOUT_CUDA();
  const cudaStream_t stream = cuda::device_context(0).stream;
  const std::vector<int> c1 = {0, 5, 130, 0, 64}, c2 = {17, 0, 200, 0, 1};
  const int E = 5, Nout = 136, K = 200;
  int n1 = 0, n2 = 0;
  for (int v : c1) n1 += v;
  for (int v : c2) n2 += v;
  Tensor dy1 = test::host_random({n1, Nout}, 21, 1.0f, true), x1 = test::host_random({n1, K}, 22, 1.0f, true);
  Tensor dy2 = test::host_random({n2, Nout}, 23, 1.0f, true), x2 = test::host_random({n2, K}, 24, 1.0f, true);
  namespace det = cuda::detail;
  struct Restore {
    ~Restore() { det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Auto); }
  } restore;
  std::vector<det::GroupedFwdKernel> kernels = {det::GroupedFwdKernel::MmaSync};
  if (cuda::device_context(0).cc_major == 9 && det::grouped_gemm_sm90_compiled())
    kernels.push_back(det::GroupedFwdKernel::Wgmma);
  for (const det::GroupedFwdKernel kernel : kernels)
  for (const bool bf16 : {false, true}) {
    det::grouped_gemm_fwd_kernel_set(kernel);
    SCOPED_TRACE(testing::Message() << (kernel == det::GroupedFwdKernel::Wgmma ? "wgmma, " : "mma.sync, ")
                                    << (bf16 ? "bf16 dW" : "fp32 dW"));
    Tensor start = test::host_random({E, Nout, K}, 25, 1.0f, /*bf16_values=*/true);
    std::vector<double> want(static_cast<size_t>(E) * Nout * K);
    const std::vector<float> sv = start.to_floats();
    for (size_t i = 0; i < want.size(); ++i) want[i] = sv[i];
    add_segment(want, c1, dy1.to_floats(), x1.to_floats(), Nout, K);
    add_segment(want, c2, dy2.to_floats(), x2.to_floats(), Nout, K);
    std::vector<float> wantf(want.begin(), want.end());
    Tensor dw = test::device_from_host(start, bf16 ? DType::BF16 : DType::F32);
    cuda::grouped_gemm_wgrad2(test::device_from_host(dy1, DType::BF16), test::device_from_host(x1, DType::BF16),
                              device_offsets(c1), test::device_from_host(dy2, DType::BF16),
                              test::device_from_host(x2, DType::BF16), device_offsets(c2), dw, /*accumulate=*/true,
                              stream);
    if (bf16)
      test::expect_norm(test::device_floats(dw), wantf, kernel == det::GroupedFwdKernel::Wgmma ? 8e-3 : 4e-3, 3e-3,
                        "wgrad2 (bf16 dW)");
    else
      test::expect_norm(test::device_floats(dw), wantf, 1e-5, 1e-5, "wgrad2 (fp32 dW)");
  }
}

}  // namespace
}  // namespace mt
