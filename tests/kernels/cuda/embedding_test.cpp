// CUDA embedding lookup and its sorted (deterministic) gradient against the CPU reference.
// Forward is a copy: exact. Backward sums the same fp32/bf16 values as the CPU but associates them
// differently ((g + Σ rows) instead of ((g + r1) + r2)…; a frequent id sums ~1400 rows): max-norm 1e-5,
// rel-L2 1e-5 (a missing or doubled row is ~1e-2); and two runs on
// the device must agree bit for bit. With a padding index, the CPU reference skips that id too, and the pad row must
// come back exactly as it went in (no sum touches it); the other rows are held to the same tolerances.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/embedding.h"

namespace mt {
namespace {

Tensor random_ids(int64_t N, int64_t V, uint64_t seed, DType dt) {
  std::mt19937_64 g(seed);
  Tensor t = Tensor::empty({N}, dt);
  for (int64_t i = 0; i < N; ++i) {
    // A third of the tokens hit id 1 (a frequent token: one long run after sorting).
    const int64_t id = (g() % 3 == 0) ? std::min<int64_t>(1, V - 1) : static_cast<int64_t>(g() % V);
    if (dt == DType::I64) t.data_as<int64_t>()[i] = id;
    else t.data_as<int32_t>()[i] = static_cast<int32_t>(id);
  }
  return t;
}

Tensor as_i64(const Tensor& ids) {
  if (ids.dtype() == DType::I64) return ids;
  Tensor t = Tensor::empty(ids.shape(), DType::I64);
  for (int64_t i = 0; i < ids.numel(); ++i) t.data_as<int64_t>()[i] = ids.data_as<int32_t>()[i];
  return t;
}

void run_case(int64_t N, int64_t V, int64_t H, DType dt, DType id_dt, uint64_t seed,
              std::optional<int64_t> pad = std::nullopt) {
  const bool bf = dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + " N=" + std::to_string(N) + " V=" + std::to_string(V) +
                           " H=" + std::to_string(H) + (pad ? " pad=" + std::to_string(*pad) : "");
  auto& ctx = cuda::device_context(0);
  Tensor ids = random_ids(N, V, seed, id_dt);
  Tensor table = test::host_random({V, H}, seed + 1, 1.0f, bf);
  Tensor want = cpu::embedding_forward(as_i64(ids), table);
  Tensor dids = cuda::to_device(ids, 0);
  Tensor out = Tensor::empty({N, H}, dt, Device::cuda(0));
  cuda::embedding_forward(dids, test::device_from_host(table, dt), out, ctx.stream);
  test::expect_near_normalised(test::device_floats(out), want.to_floats(), 0.0, 0.0, what + " forward");

  Tensor dout = test::host_random({N, H}, seed + 2, 1.0f, bf);
  Tensor g0 = test::host_random({V, H}, seed + 3, 0.1f);
  Tensor gcpu = g0.clone();
  cpu::embedding_backward(as_i64(ids), dout, gcpu, pad);
  Tensor ddout = test::device_from_host(dout, dt);
  Tensor g1 = cuda::to_device(g0, 0), g2 = cuda::to_device(g0, 0);
  cuda::embedding_backward(dids, ddout, g1, pad, ctx.stream);
  cuda::embedding_backward(dids, ddout, g2, pad, ctx.stream);
  const std::vector<float> got = test::device_floats(g1);
  test::expect_near_normalised(got, gcpu.to_floats(), 1e-5, 1e-5, what + " backward");
  EXPECT_EQ(got, test::device_floats(g2)) << what << ": backward is not deterministic";
  if (pad) {
    const std::vector<float> start = g0.to_floats();
    for (int64_t h = 0; h < H; ++h)
      ASSERT_EQ(got[*pad * H + h], start[*pad * H + h]) << what << ": the pad row got a gradient at column " << h;
  }
}

TEST(CudaEmbedding, MatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 900;
  for (DType dt : {DType::BF16, DType::F32}) {
    run_case(1, 1, 1, dt, DType::I64, seed += 10);
    run_case(37, 11, 33, dt, DType::I64, seed += 10);
    run_case(1000, 151, 300, dt, DType::I32, seed += 10);
    run_case(4096, 5000, 64, dt, DType::I64, seed += 10);
    run_case(0, 10, 8, dt, DType::I64, seed += 10);
  }
}

// The padding index on the frequent id (one long sorted run), on id 0 and on the last id (next to the out-of-range
// key V the kernel already skips), with both id dtypes; and on a vocabulary of one (every token is the pad).
TEST(CudaEmbedding, PaddingIdxMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 1900;
  for (DType dt : {DType::BF16, DType::F32}) {
    run_case(1000, 151, 300, dt, DType::I32, seed += 10, int64_t{1});
    run_case(4096, 5000, 64, dt, DType::I64, seed += 10, int64_t{0});
    run_case(37, 11, 33, dt, DType::I64, seed += 10, int64_t{10});
    run_case(5, 1, 7, dt, DType::I32, seed += 10, int64_t{0});
  }
}

TEST(CudaEmbedding, PaddingIdxOutsideVocabularyIsRefused) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  Tensor dids = cuda::to_device(random_ids(4, 3, 5, DType::I64), 0);
  Tensor dout = cuda::to_device(test::host_random({4, 2}, 6), 0);
  Tensor dg = cuda::to_device(Tensor::zeros({3, 2}, DType::F32), 0);
  EXPECT_THROW(cuda::embedding_backward(dids, dout, dg, int64_t{3}, ctx.stream), Error);
  EXPECT_THROW(cuda::embedding_backward(dids, dout, dg, int64_t{-1}, ctx.stream), Error);
}

TEST(CudaEmbedding, OutOfRangeIdsAreInert) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  Tensor ids = Tensor::empty({3}, DType::I64);
  ids.data_as<int64_t>()[0] = 2;
  ids.data_as<int64_t>()[1] = -5;
  ids.data_as<int64_t>()[2] = 4;  // == V
  Tensor table = test::host_random({4, 3}, 1);
  Tensor out = Tensor::empty({3, 3}, DType::F32, Device::cuda(0));
  Tensor dids = cuda::to_device(ids, 0);
  cuda::embedding_forward(dids, cuda::to_device(table, 0), out, ctx.stream);
  const std::vector<float> o = test::device_floats(out), t = table.to_floats();
  EXPECT_EQ(std::vector<float>(o.begin(), o.begin() + 3), std::vector<float>(t.begin() + 6, t.begin() + 9));
  EXPECT_EQ(std::vector<float>(o.begin() + 3, o.end()), std::vector<float>(6, 0.0f));
  Tensor g = Tensor::zeros({4, 3}, DType::F32);
  Tensor dg = cuda::to_device(g, 0);
  cuda::embedding_backward(dids, cuda::to_device(Tensor::from_floats({3, 3}, std::vector<float>(9, 1.0f)), 0), dg,
                           std::nullopt, ctx.stream);
  std::vector<float> want(12, 0.0f);
  want[6] = want[7] = want[8] = 1.0f;
  EXPECT_EQ(test::device_floats(dg), want);
}

}  // namespace
}  // namespace mt
