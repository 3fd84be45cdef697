// The expert-parallel receive layouts (kernels/cuda/ep_regroup.h) against a host reference: for a
// group of 3 ranks with 4 experts each, random per-(source, expert) row counts (zeros included) give the
// expected segment table and expert-major offsets, and the regroup moves every row to where the
// reference puts it and back.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/ep_regroup.h"
#include "layers/cuda/expert_parallel_cuda.h"

namespace mt {
namespace {

TEST(CudaEpRegroup, LayoutAndRoundTripMatchReference) {
  MT_SKIP_WITHOUT_CUDA();
  const int ep = 3, el = 4, E = ep * el, me = 1, H = 16;
  std::mt19937 g(11);
  // counts[s][e]: rows source s routes to global expert e (only this rank's experts matter).
  std::vector<std::vector<int32_t>> counts(ep, std::vector<int32_t>(E));
  for (auto& row : counts)
    for (auto& c : row) c = static_cast<int32_t>(g() % 5);  // 0..4, zeros included
  counts[2][me * el + 1] = 0;
  std::vector<int32_t> gathered(ep * (E + 1));
  for (int s = 0; s < ep; ++s) {
    gathered[s * (E + 1)] = 0;
    for (int e = 0; e < E; ++e) gathered[s * (E + 1) + e + 1] = gathered[s * (E + 1) + e] + counts[s][e];
  }
  // Reference: source-major row order is (s, e, q); expert-major is (e, s, q).
  struct Row { int s, e, q; };
  std::vector<Row> src_major, exp_major;
  for (int s = 0; s < ep; ++s)
    for (int e = 0; e < el; ++e)
      for (int q = 0; q < counts[s][me * el + e]; ++q) src_major.push_back({s, e, q});
  for (int e = 0; e < el; ++e)
    for (int s = 0; s < ep; ++s)
      for (int q = 0; q < counts[s][me * el + e]; ++q) exp_major.push_back({s, e, q});
  const int64_t N = static_cast<int64_t>(src_major.size());
  ASSERT_GT(N, 0);

  Tensor gt = Tensor::empty({ep, E + 1}, DType::I32);
  std::copy(gathered.begin(), gathered.end(), gt.data_as<int32_t>());
  cudaStream_t stream = cuda::device_context(0).stream;
  cuda::EpLayout L = cuda::ep_layout(cuda::to_device(gt, 0), me, el, stream);
  const Tensor offs = cuda::to_host(L.local_offsets);
  int32_t expect_off = 0;
  for (int e = 0; e < el; ++e) {
    EXPECT_EQ(offs.data_as<int32_t>()[e], expect_off) << "expert " << e;
    for (int s = 0; s < ep; ++s) expect_off += counts[s][me * el + e];
  }
  EXPECT_EQ(offs.data_as<int32_t>()[el], N);

  // Each source-major row r holds the value code(s, e, q) in every column.
  auto code = [](const Row& r) { return static_cast<float>(r.s * 100 + r.e * 10 + r.q); };
  std::vector<float> src(N * H);
  for (int64_t r = 0; r < N; ++r)
    for (int h = 0; h < H; ++h) src[r * H + h] = code(src_major[r]);
  Tensor host = Tensor::from_floats({N, H}, src, DType::BF16);
  Tensor d_src = cuda::to_device(host, 0);
  Tensor d_exp = Tensor::empty({N, H}, DType::BF16, Device::cuda(0));
  cuda::ep_regroup(d_src, L, /*to_expert_major=*/true, d_exp, stream);
  const std::vector<float> got = cuda::to_host(d_exp).to_floats();
  for (int64_t r = 0; r < N; ++r)
    for (int h = 0; h < H; ++h) ASSERT_EQ(got[r * H + h], code(exp_major[r])) << "expert-major row " << r;
  Tensor d_back = Tensor::empty({N, H}, DType::BF16, Device::cuda(0));
  cuda::ep_regroup(d_exp, L, /*to_expert_major=*/false, d_back, stream);
  EXPECT_EQ(cuda::to_host(d_back).to_floats(), src);
}

}  // namespace
}  // namespace mt

namespace mt {
namespace {

// Buffer rows for N received rows: never fewer than N (nor than 1), at most 1/16 more, and few distinct
// values around a typical count (the allocator reuses them).
TEST(CudaEpRegroup, PaddedRowsBoundAndRepeat) {
  EXPECT_EQ(ep_padded_rows(0), 1);
  EXPECT_EQ(ep_padded_rows(1), 1);
  EXPECT_EQ(ep_padded_rows(16), 16);
  EXPECT_EQ(ep_padded_rows(17), 17);
  EXPECT_EQ(ep_padded_rows(32768), 32768);
  EXPECT_EQ(ep_padded_rows(32769), 32768 + 2048);
  std::set<int64_t> sizes;
  for (int64_t n = 1; n < 100000; ++n) {
    const int64_t p = ep_padded_rows(n);
    ASSERT_GE(p, n);
    ASSERT_LE(p, n + n / 16 + 1) << n;
    if (n >= 30000 && n <= 36000) sizes.insert(p);
  }
  EXPECT_LE(sizes.size(), 5u);  // 30k..36k rows: 30720, 31744, 32768, 34816, 36864
}

}  // namespace
}  // namespace mt
