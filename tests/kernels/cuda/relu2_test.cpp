// CUDA ReLU² (kernels/cuda/relu2.h) against the CPU kernel (kernels/cpu/relu2.h), forward and backward, BF16 and F32,
// on the 16-byte packet path (bf16, N·F a multiple of 8) and the per-element one (odd sizes, F32), N·F = 0 included.
// Thresholds: none — bit equality. Neither side has a transcendental function: the forward is relu by comparison and
// one fp32 product (x·x), rounded once to bf16 on both sides (round-to-nearest-even); the backward is one fp32 product
// (2u)·d (2u exact), which the CPU keeps in fp32 and the GPU rounds once to the dtype, so the GPU's BF16 result is the
// CPU's rounded once and its F32 result the CPU's. Inputs include exact zeros, negative zeros and NaN (relu gives 0 for
// NaN on both sides: the comparison u > 0 is false).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/relu2.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/relu2.h"

namespace mt {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The first index where a and b differ in bits, for the failure message.
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return "element " + std::to_string(i) + ": got " + std::to_string(a[i]) + " want " + std::to_string(b[i]);
  return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
}

// Random values (bf16-representable in BF16 mode) with zeros, a negative zero and a NaN sprinkled in.
Tensor input(int64_t N, int64_t F, uint64_t seed, bool bf) {
  Tensor t = test::host_random({N, F}, seed, 2.0f, bf);
  float* p = t.data_as<float>();
  const int64_t n = N * F;
  for (int64_t i = 0; i < n; i += 7) p[i] = 0.0f;
  if (n > 3) p[3] = -0.0f;
  if (n > 5) p[5] = std::numeric_limits<float>::quiet_NaN();
  return t;
}

void run_case(int64_t N, int64_t F, DType dt, uint64_t seed) {
  const bool bf = dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + " N=" + std::to_string(N) + " F=" + std::to_string(F);
  SCOPED_TRACE(what);
  const cudaStream_t stream = cuda::device_context(0).stream;
  const Tensor u = input(N, F, seed, bf);
  const Tensor du_in = test::host_random({N, F}, seed + 1, 1.0f, bf);

  // Forward: the CPU's bf16 mode rounds the square once, as the GPU stores it.
  const std::vector<float> a_want = cpu::relu2_forward(u, bf).to_floats();
  const Tensor ud = test::device_from_host(u, dt);
  Tensor a = Tensor::empty({N, F}, dt, Device::cuda(0));
  cuda::relu2_forward(ud, a, stream);
  const std::vector<float> a_got = test::device_floats(a);
  EXPECT_TRUE(same_bits(a_got, a_want)) << "forward: " << first_difference(a_got, a_want);

  // Backward: the CPU's fp32 du, rounded once to the dtype.
  std::vector<float> du_want = cpu::relu2_backward(du_in, u).to_floats();
  if (bf)
    for (float& x : du_want) x = round_bf16(x);
  const Tensor dd = test::device_from_host(du_in, dt);
  Tensor du = Tensor::empty({N, F}, dt, Device::cuda(0));
  cuda::relu2_backward(dd, ud, du, stream);
  const std::vector<float> du_got = test::device_floats(du);
  EXPECT_TRUE(same_bits(du_got, du_want)) << "backward: " << first_difference(du_got, du_want);

  // In place (out aliases the input) gives the same bits.
  Tensor inplace = test::device_from_host(u, dt);
  cuda::relu2_forward(inplace, inplace, stream);
  EXPECT_TRUE(same_bits(test::device_floats(inplace), a_want)) << "forward in place";
  Tensor dinplace = test::device_from_host(du_in, dt);
  cuda::relu2_backward(dinplace, ud, dinplace, stream);
  EXPECT_TRUE(same_bits(test::device_floats(dinplace), du_want)) << "backward in place";
}

TEST(CudaRelu2, MatchesCpuBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 4100;
  // (64, 768), (8, 1856), (3, 3000): N·F a multiple of 8, packets of 8 in BF16; (1, 1), (7, 33), (129, 100): not, per
  // element; (0, 16): nothing to do. F32 is per element throughout.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {7, 33}, {64, 768}, {8, 1856}, {129, 100}, {3, 3000}, {0, 16}};
  for (DType dt : {DType::BF16, DType::F32})
    for (auto [N, F] : shapes) run_case(N, F, dt, seed += 10);
}

TEST(CudaRelu2, RejectsMismatchedTensors) {
  MT_SKIP_WITHOUT_CUDA();
  const cudaStream_t stream = cuda::device_context(0).stream;
  const Tensor u = Tensor::empty({4, 8}, DType::BF16, Device::cuda(0));
  Tensor short_out = Tensor::empty({4, 7}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(cuda::relu2_forward(u, short_out, stream), Error);
  Tensor f32_out = Tensor::empty({4, 8}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::relu2_forward(u, f32_out, stream), Error);
  Tensor transposed = Tensor::empty({8, 4}, DType::BF16, Device::cuda(0));  // same count, other shape
  EXPECT_THROW(cuda::relu2_forward(u, transposed, stream), Error);
  Tensor du = Tensor::empty({4, 8}, DType::BF16, Device::cuda(0));
  const Tensor dout_f32 = Tensor::empty({4, 8}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::relu2_backward(dout_f32, u, du, stream), Error);
  const Tensor i32 = Tensor::empty({4, 8}, DType::I32, Device::cuda(0));
  Tensor i32_out = Tensor::empty({4, 8}, DType::I32, Device::cuda(0));
  EXPECT_THROW(cuda::relu2_forward(i32, i32_out, stream), Error);
}

}  // namespace
}  // namespace mt
