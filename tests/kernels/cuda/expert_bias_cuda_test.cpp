// DeepSeek-V3's auxiliary-loss-free bias update on the GPU (kernels/cuda/expert_bias.h) against the CPU rule
// (kernels/cpu/expert_bias.h): bitwise, since both take the sign on int64 integers and add ±fp32(γ) once in fp32.
// Also the per-expert load count (cuda::router_expert_load_add) on many slots, with its shared-memory histogram and,
// past 12,288 experts, without it: integer counts, compared exactly with the CPU count.
#include "kernels/cpu/expert_bias.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/router_sigmoid_group.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/expert_bias.h"
#include "kernels/cuda/router_sigmoid_group.h"

namespace mt {
namespace {

cudaStream_t stream0() { return cuda::device_context(0).stream; }

Tensor counts(int64_t E, uint64_t seed, int kind) {
  std::mt19937_64 g(seed);
  Tensor t = Tensor::empty({E}, DType::I32);
  int32_t* c = t.data_as<int32_t>();
  for (int64_t e = 0; e < E; ++e) {
    switch (kind) {
      case 0: c[e] = static_cast<int32_t>(g() % 1000); break;                     // uneven
      case 1: c[e] = 77; break;                                                    // even: nothing moves
      case 2: c[e] = e % 3 == 0 ? 5 : 4; break;                                    // around a non-integer mean
      default: c[e] = e < 2 ? 1 << 28 : static_cast<int32_t>(g() % 3); break;     // skewed, large
    }
  }
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(ExpertBiasCuda, UpdateIsBitwiseTheCpuRule) {
  MT_SKIP_WITHOUT_CUDA();
  int cases = 0;
  for (int64_t E : {1, 7, 8, 64, 256, 1000, 1024, 1025, 4096, 65536})
    for (int kind = 0; kind < 4; ++kind)
      for (double rate : {0.0, 1e-3, 0.1, 1.0 / 3.0}) {
        SCOPED_TRACE("E " + std::to_string(E) + " kind " + std::to_string(kind) + " rate " + std::to_string(rate));
        const Tensor load = counts(E, 11 + E + kind, kind);
        Tensor want = test::host_random({E}, 5 + E, 0.5f);
        Tensor dev_bias = cuda::to_device(want, 0);
        const Tensor dev_load = cuda::to_device(load, 0);
        for (int step = 0; step < 3; ++step) {  // repeated steps accumulate the same roundings
          cpu::expert_bias_update(load, want, rate);
          cuda::expert_bias_update(dev_load, dev_bias, rate, stream0());
        }
        EXPECT_TRUE(same_bits(cuda::to_host(dev_bias), want));
        ++cases;
      }
  EXPECT_EQ(cases, 160);
}

TEST(ExpertBiasCuda, LoadCountOfManySlotsIsTheCpuCount) {
  MT_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t T, k, E;
  };
  // DeepSeek-V3's 256 experts top-8 on 16K tokens (shared-memory histogram over 64 blocks); a skewed 8-expert router
  // (every block's atomics on a few counters); 20,000 experts (global atomics, no histogram).
  for (const Case c : {Case{16384, 8, 256}, Case{5000, 2, 8}, Case{3000, 4, 20000}, Case{1, 1, 1}}) {
    SCOPED_TRACE("T " + std::to_string(c.T) + " k " + std::to_string(c.k) + " E " + std::to_string(c.E));
    std::mt19937_64 g(c.T * 31 + c.E);
    Tensor index = Tensor::empty({c.T, c.k}, DType::I32);
    for (int64_t i = 0; i < index.numel(); ++i)
      index.data_as<int32_t>()[i] = c.E == 8 && g() % 4 != 0 ? static_cast<int32_t>(i % 2)
                                                             : static_cast<int32_t>(g() % static_cast<uint64_t>(c.E));
    Tensor want = Tensor::zeros({c.E}, DType::I32);
    cpu::router_expert_load_add(index, want);
    cpu::router_expert_load_add(index, want);  // two micro-batches
    Tensor dev = cuda::to_device(Tensor::zeros({c.E}, DType::I32), 0);
    const Tensor dev_index = cuda::to_device(index, 0);
    cuda::router_expert_load_add(dev_index, dev, stream0());
    cuda::router_expert_load_add(dev_index, dev, stream0());
    EXPECT_TRUE(same_bits(cuda::to_host(dev), want));
  }
}

TEST(ExpertBiasCuda, RefusesMalformedInputs) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor load = cuda::to_device(Tensor::zeros({8}, DType::I32), 0);
  Tensor bias = cuda::to_device(Tensor::zeros({8}, DType::F32), 0);
  Tensor short_bias = cuda::to_device(Tensor::zeros({7}, DType::F32), 0);
  Tensor bf16_bias = cuda::to_device(Tensor::zeros({8}, DType::BF16), 0);
  Tensor host_bias = Tensor::zeros({8}, DType::F32);
  EXPECT_THROW(cuda::expert_bias_update(load, short_bias, 0.1, stream0()), Error);
  EXPECT_THROW(cuda::expert_bias_update(load, bf16_bias, 0.1, stream0()), Error);
  EXPECT_THROW(cuda::expert_bias_update(load, host_bias, 0.1, stream0()), Error);
  EXPECT_THROW(cuda::expert_bias_update(load, bias, -0.1, stream0()), Error);
  EXPECT_THROW(cuda::expert_bias_update(load, bias, std::nan(""), stream0()), Error);
  EXPECT_THROW(cuda::expert_bias_update(bias, bias, 0.1, stream0()), Error);  // loads must be I32
}

}  // namespace
}  // namespace mt
