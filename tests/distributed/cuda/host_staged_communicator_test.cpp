// The host-staged GPU collectives (distributed/cuda/host_staged_communicator.h) against values computed
// here: three ranks as threads of this process over loopback TCP, all on GPU 0 (what NCCL refuses and this
// communicator exists for). Sums must be bitwise the rank-order sums in the element type.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../thread_ranks.h"
#include "core/float_convert.h"
#include "distributed/communicator.h"
#include "distributed/cuda/device_communicator.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"

namespace mt {
namespace {

// Rank r's test values: distinct per rank and element, not exactly representable sums.
float value(int rank, int64_t i) { return 0.1f * static_cast<float>(rank + 1) + 1.0e-3f * static_cast<float>(i) - 0.37f; }

template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(const std::vector<T>& host) : n(host.size()) {
    MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)));
    if (n) MT_CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) MT_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Runs body(rank, host communicator, stream) on `world` threads sharing GPU 0; fails the test on any error.
void on_ranks(int world, const std::function<void(int, Communicator&, cudaStream_t)>& body) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(world, [&](int r) {
    cuda::device_set(0);
    auto host = tcp_communicator_create(test::env_of(r, world, port), std::chrono::seconds(60));
    cudaStream_t s = nullptr;
    MT_CUDA_CHECK(cudaStreamCreate(&s));
    body(r, *host, s);
    MT_CUDA_CHECK(cudaStreamDestroy(s));
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(CudaHostStagedCommunicator, SumsAreTheRankOrderSumsInTheElementType) {
  MT_SKIP_WITHOUT_CUDA();
  constexpr int kWorld = 3;
  constexpr int64_t kN = 1000;
  std::vector<std::vector<float>> f32(kWorld);
  std::vector<std::vector<double>> f64(kWorld);
  std::vector<std::vector<uint16_t>> b16(kWorld);
  for (int r = 0; r < kWorld; ++r)
    for (int64_t i = 0; i < kN; ++i) {
      f32[r].push_back(value(r, i));
      f64[r].push_back(static_cast<double>(value(r, i)) / 3.0);
      b16[r].push_back(float_to_bf16(value(r, i) * 7.0f));
    }
  on_ranks(kWorld, [&](int r, Communicator& host, cudaStream_t s) {
    auto comm = device_communicator_create(DeviceCollectives::host, host, 0, std::chrono::seconds(60));
    ASSERT_EQ(comm->rank(), r);
    ASSERT_EQ(comm->size(), kWorld);
    DeviceBuffer<float> a(f32[r]);
    DeviceBuffer<double> b(f64[r]);
    DeviceBuffer<uint16_t> c(b16[r]);
    comm->all_reduce_sum({{a.p, kN, DType::F32}, {b.p, kN, DType::F64}, {c.p, kN, DType::BF16}}, s, "test sums");
    const auto ha = a.host();
    const auto hb = b.host();
    const auto hc = c.host();
    for (int64_t i = 0; i < kN; ++i) {
      const float ea = (f32[0][i] + f32[1][i]) + f32[2][i];
      const double eb = (f64[0][i] + f64[1][i]) + f64[2][i];
      const uint16_t ec =
          float_to_bf16((bf16_to_float(b16[0][i]) + bf16_to_float(b16[1][i])) + bf16_to_float(b16[2][i]));
      ASSERT_EQ(std::memcmp(&ha[i], &ea, 4), 0) << "f32 element " << i;
      ASSERT_EQ(std::memcmp(&hb[i], &eb, 8), 0) << "f64 element " << i;
      ASSERT_EQ(hc[i], ec) << "bf16 element " << i;
    }
    // reduce onto roots 2 and 0 in one call: the root holds the rank-order sum, the others keep their data
    DeviceBuffer<float> r2(std::vector<float>{value(r, 5), value(r, 6)}), r0(std::vector<float>{value(r, 7)});
    comm->reduce_sum({{r2.p, 2, DType::F32, 2}, {r0.p, 1, DType::F32, 0}}, s, "test reduce");
    const auto h2 = r2.host();
    const auto h0 = r0.host();
    for (int i = 0; i < 2; ++i) {
      const float e = r == 2 ? (value(0, 5 + i) + value(1, 5 + i)) + value(2, 5 + i) : value(r, 5 + i);
      ASSERT_EQ(std::memcmp(&h2[i], &e, 4), 0) << "reduce onto rank 2, element " << i;
    }
    const float e0 = r == 0 ? (value(0, 7) + value(1, 7)) + value(2, 7) : value(r, 7);
    ASSERT_EQ(std::memcmp(&h0[0], &e0, 4), 0) << "reduce onto rank 0";
    // reduce-scatter: rank r receives the sum of everyone's r-th slice
    std::vector<float> whole;
    for (int j = 0; j < kWorld; ++j)
      for (int64_t i = 0; i < 10; ++i) whole.push_back(value(r, 100 * j + i));
    DeviceBuffer<float> send(whole), recv(std::vector<float>(10, -1.0f));
    comm->reduce_scatter_sum(send.p, recv.p, 10, DType::F32, s, "test reduce-scatter");
    const auto hr = recv.host();
    for (int64_t i = 0; i < 10; ++i) {
      const float e = (value(0, 100 * r + i) + value(1, 100 * r + i)) + value(2, 100 * r + i);
      ASSERT_EQ(std::memcmp(&hr[i], &e, 4), 0) << "slice element " << i;
    }
  });
}

TEST(CudaHostStagedCommunicator, MovesBytesLikeTheNcclCommunicator) {
  MT_SKIP_WITHOUT_CUDA();
  constexpr int kWorld = 3;
  on_ranks(kWorld, [&](int r, Communicator& host, cudaStream_t s) {
    auto comm = device_communicator_create(DeviceCollectives::host, host, 0, std::chrono::seconds(60));
    // Broadcasts from three roots in one call, one of them empty.
    std::vector<int32_t> p0(5, r == 0 ? 11 : -1), p2(7, r == 2 ? 22 : -1), p1(0);
    DeviceBuffer<int32_t> b0(p0), b2(p2), b1(p1);
    comm->broadcast({{b0.p, 5, DType::I32, 0}, {b2.p, 7, DType::I32, 2}, {b1.p, 0, DType::I32, 1}}, s, "test bcast");
    EXPECT_EQ(b0.host(), std::vector<int32_t>(5, 11));
    EXPECT_EQ(b2.host(), std::vector<int32_t>(7, 22));
    // All-gather of two parts.
    DeviceBuffer<int32_t> g1(std::vector<int32_t>{r, 10 * r}), g2(std::vector<int32_t>{100 + r});
    DeviceBuffer<int32_t> o1(std::vector<int32_t>(6, -1)), o2(std::vector<int32_t>(3, -1));
    comm->all_gather({{g1.p, o1.p, 2, DType::I32}, {g2.p, o2.p, 1, DType::I32}}, s, "test gather");
    EXPECT_EQ(o1.host(), (std::vector<int32_t>{0, 0, 1, 10, 2, 20}));
    EXPECT_EQ(o2.host(), (std::vector<int32_t>{100, 101, 102}));
    // all_to_allv: rank r sends j + 1 rows (of two int32) to rank j, each row {r, j}; rank r receives r + 1
    // rows from each rank, laid out in rank order after one unused row.
    std::vector<int32_t> send;
    std::vector<int64_t> sf, sr, rf, rr;
    for (int j = 0; j < kWorld; ++j) {
      sf.push_back(static_cast<int64_t>(send.size()) / 2);
      sr.push_back(j + 1);
      for (int k = 0; k <= j; ++k) send.insert(send.end(), {r, j});
      rf.push_back(1 + j * (r + 1));
      rr.push_back(r + 1);
    }
    DeviceBuffer<int32_t> sd(send), rd(std::vector<int32_t>(2 * (1 + kWorld * (r + 1)), -1));
    comm->all_to_allv(sd.p, sf, sr, rd.p, rf, rr, 2 * sizeof(int32_t), s, "test all_to_allv");
    std::vector<int32_t> want = {-1, -1};
    for (int j = 0; j < kWorld; ++j)
      for (int k = 0; k <= r; ++k) want.insert(want.end(), {j, r});
    EXPECT_EQ(rd.host(), want);
    // send_recv from rank 2 to rank 0; rank 1 takes no part.
    DeviceBuffer<int32_t> sr_buf(std::vector<int32_t>(4, r));
    if (r != 1) comm->send_recv(sr_buf.p, 4 * sizeof(int32_t), 2, 0, s, "test send_recv");
    EXPECT_EQ(sr_buf.host(), std::vector<int32_t>(4, r == 0 ? 2 : r));
  });
}

// Groups: ranks {0, 2} and {1} sum among themselves, ranked in the listed order.
TEST(CudaHostStagedCommunicator, GroupsSumAmongTheirMembers) {
  MT_SKIP_WITHOUT_CUDA();
  on_ranks(3, [&](int r, Communicator& host, cudaStream_t s) {
    auto comm = device_communicator_create(DeviceCollectives::host, host, 0, std::chrono::seconds(60),
                                           {{2, 0}, {1}}, "test group");
    EXPECT_EQ(comm->rank(), r == 2 ? 0 : r == 0 ? 1 : 0);
    EXPECT_EQ(comm->size(), r == 1 ? 1 : 2);
    DeviceBuffer<float> a(std::vector<float>{value(r, 0)});
    comm->all_reduce_sum(a.p, 1, DType::F32, s, "test group sum");
    const float e = r == 1 ? value(1, 0) : value(2, 0) + value(0, 0);
    EXPECT_EQ(a.host()[0], e);
  });
}

}  // namespace
}  // namespace mt
