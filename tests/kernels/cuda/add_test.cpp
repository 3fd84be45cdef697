// CUDA elementwise add (the two-rank reduce-scatter's local sum) against the host: fp32 sum rounded once,
// bit for bit, for BF16 and F32, on the vector path (16-byte aligned, with a scalar tail) and the
// scalar path (an unaligned view), in place too.
#include "kernels/cuda/add.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "kernels/cuda/device_context.h"

namespace mt {
namespace {

cudaStream_t stream0() { return cuda::device_context(0).stream; }

TEST(CudaAdd, MatchesHostSumRoundedOnce) {
  MT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dt == DType::BF16 ? "bf16" : "f32");
    const int64_t rows = 37, cols = 21;  // 777 elements: 97 vectors of 8 and a tail of 1
    Tensor a = test::host_random({rows + 1, cols}, 1, 1.0f, true), b = test::host_random({rows + 1, cols}, 2, 1.0f, true);
    const std::vector<float> av = a.to_floats(), bv = b.to_floats();
    Tensor da = test::device_from_host(a, dt), db = test::device_from_host(b, dt);
    auto want = [&](int64_t first, int64_t n) {
      std::vector<float> w(static_cast<size_t>(n * cols));
      for (int64_t i = 0; i < n * cols; ++i) {
        const float s = av[first * cols + i] + bv[first * cols + i];
        w[i] = dt == DType::BF16 ? round_bf16(s) : s;
      }
      return w;
    };
    Tensor out = Tensor::empty({rows + 1, cols}, dt, Device::cuda(0));
    cuda::add(da, db, out, stream0());
    EXPECT_EQ(test::device_floats(out), want(0, rows + 1));
    // Row 1 on: 21 elements in, not 16-byte aligned -> the scalar kernel.
    Tensor va = da.rows(1, rows + 1), vb = db.rows(1, rows + 1), vo = out.rows(1, rows + 1);
    cuda::add(va, vb, vo, stream0());
    EXPECT_EQ(test::device_floats(vo), want(1, rows));
    // In place.
    cuda::add(da, db, da, stream0());
    EXPECT_EQ(test::device_floats(da), want(0, rows + 1));
  }
  Tensor x = Tensor::empty({4, 8}, DType::BF16, Device::cuda(0)), y = Tensor::empty({4, 8}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::add(x, y, x, stream0()), Error);
}

}  // namespace
}  // namespace mt
