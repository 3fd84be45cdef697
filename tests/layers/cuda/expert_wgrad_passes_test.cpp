// ExpertWgradPasses (layers/cuda/expert_wgrad_passes.h): a gradient marked with overwrite_next() holds
// garbage (a value far from any product) and must end up as exactly the sum of the micro-batches' products,
// with pairing off (first pass stores, second adds) and on (the two micro-batches in one storing pass);
// a marked gradient that no pass writes is zero after flush(); an unmarked one keeps adding. F32 dW, so
// only the summation order differs from the double-precision host sum (1e-5).
#include "layers/cuda/expert_wgrad_passes.h"

#include <gtest/gtest.h>

#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../../kernels/cuda/error_report.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"

namespace mt {
namespace {

constexpr int E = 3, Nout = 72, K = 40;

struct MicroBatch {
  std::vector<int> counts;
  Tensor dy, x, offsets;  // device
  std::vector<float> dyv, xv;
};

MicroBatch micro_batch(std::vector<int> counts, uint64_t seed) {
  MicroBatch m;
  m.counts = counts;
  int rows = 0;
  for (int c : counts) rows += c;
  Tensor dy = test::host_random({rows, Nout}, seed, 1.0f, true), x = test::host_random({rows, K}, seed + 1, 1.0f, true);
  m.dyv = dy.to_floats();
  m.xv = x.to_floats();
  m.dy = test::device_from_host(dy, DType::BF16);
  m.x = test::device_from_host(x, DType::BF16);
  Tensor h = Tensor::empty({E + 1}, DType::I32);
  int32_t* p = h.data_as<int32_t>();
  p[0] = 0;
  for (int e = 0; e < E; ++e) p[e + 1] = p[e] + counts[e];
  m.offsets = cuda::to_device(h, 0);
  return m;
}

void add_product(std::vector<float>& dw, const MicroBatch& m) {
  int r0 = 0;
  for (int e = 0; e < E; ++e) {
    for (int n = 0; n < Nout; ++n)
      for (int k = 0; k < K; ++k) {
        double s = 0;
        for (int r = r0; r < r0 + m.counts[e]; ++r) s += double(m.dyv[r * Nout + n]) * m.xv[r * K + k];
        dw[(e * Nout + n) * K + k] += static_cast<float>(s);
      }
    r0 += m.counts[e];
  }
}

Tensor garbage_dw(float v) {
  return cuda::to_device(Tensor::from_floats({E, Nout, K}, std::vector<float>(size_t(E) * Nout * K, v)), 0);
}

TEST(CudaExpertWgradPasses, FirstPassOverwritesWithAndWithoutPairing) {
  MT_SKIP_WITHOUT_CUDA();
  const cudaStream_t stream = cuda::device_context(0).stream;
  const MicroBatch a = micro_batch({5, 0, 130}, 61), b = micro_batch({0, 17, 64}, 63);
  std::vector<float> want(size_t(E) * Nout * K, 0.0f);
  add_product(want, a);
  add_product(want, b);
  for (const bool pair : {false, true}) {
    SCOPED_TRACE(pair ? "pairing on" : "pairing off");
    ExpertWgradPasses passes;
    passes.resize(1);
    passes.set_pairing(pair);
    Tensor dw = garbage_dw(1.0e6f), untouched = garbage_dw(-3.0e5f);
    passes.overwrite_next(dw);
    passes.overwrite_next(dw);  // a second mark changes nothing: the second micro-batch must still add
    passes.overwrite_next(untouched);
    passes.add(0, ExpertWgradPasses::down, a.dy, a.x, a.offsets, dw, stream);
    passes.add(0, ExpertWgradPasses::down, b.dy, b.x, b.offsets, dw, stream);
    passes.flush(stream);
    EXPECT_TRUE(passes.empty());
    test::expect_norm(test::device_floats(dw), want, 1e-5, 1e-5, "marked dW after two micro-batches");
    for (float v : test::device_floats(untouched)) ASSERT_EQ(v, 0.0f) << "a marked dW no pass wrote must be zero";

    // Unmarked: the next step's passes add to what is there.
    passes.add(0, ExpertWgradPasses::down, a.dy, a.x, a.offsets, dw, stream);
    passes.flush(stream);
    std::vector<float> twice = want;
    add_product(twice, a);
    test::expect_norm(test::device_floats(dw), twice, 1e-5, 1e-5, "unmarked dW adds");
  }
}

}  // namespace
}  // namespace mt
