// CUDA token permutation (plan, gather, combine, their backward) against host references. The plan must
// equal the CPU experts' stable counting sort exactly; gather copies rows bit for bit; the combine
// performs the same fp32 operations in the same slot order as cpu::experts_forward (bf16(w·y) per slot,
// one final rounding), so it is compared bit for bit too. Only dweights (an fp32 dot over H, summed in
// a different order) uses a tolerance: 1e-5 relative.
#include "kernels/cuda/moe_permute.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/ep_row_watch.h"

namespace mt {
namespace {

cudaStream_t stream0() { return cuda::device_context(0).stream; }

std::vector<int32_t> host_ints(const Tensor& dev) {
  Tensor h = cuda::to_host(dev);
  return {h.data_as<int32_t>(), h.data_as<int32_t>() + h.numel()};
}

// Top-k ids with distinct experts per token, drawn from `used` experts only (the rest stay empty).
std::vector<int32_t> random_index(int T, int k, int E, int used, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> idx(static_cast<size_t>(T) * k);
  std::vector<int> pool(E);
  for (int e = 0; e < E; ++e) pool[e] = e;
  std::shuffle(pool.begin(), pool.end(), g);
  pool.resize(used);
  for (int t = 0; t < T; ++t) {
    std::vector<int> p = pool;
    std::shuffle(p.begin(), p.end(), g);
    for (int s = 0; s < k; ++s) idx[t * k + s] = p[s];
  }
  return idx;
}

struct HostPlan {
  std::vector<int32_t> offsets, row, slot;
};

// Stable counting sort in slot order (what cpu::experts_forward saves).
HostPlan host_plan(const std::vector<int32_t>& idx, int E) {
  HostPlan p;
  const int N = static_cast<int>(idx.size());
  p.offsets.assign(E + 1, 0);
  for (int i = 0; i < N; ++i) p.offsets[idx[i] + 1]++;
  for (int e = 0; e < E; ++e) p.offsets[e + 1] += p.offsets[e];
  p.row.resize(N), p.slot.resize(N);
  std::vector<int32_t> fill(p.offsets.begin(), p.offsets.end() - 1);
  for (int i = 0; i < N; ++i) {
    const int r = fill[idx[i]]++;
    p.row[i] = r, p.slot[r] = i;
  }
  return p;
}

Tensor device_index(int T, int k, const std::vector<int32_t>& idx) {
  Tensor h = Tensor::empty({T, k}, DType::I32);
  std::copy(idx.begin(), idx.end(), h.data_as<int32_t>());
  return cuda::to_device(h, 0);
}

struct PermCase {
  int T, k, E, used, H;
};

TEST(CudaPermute, PlanEqualsStableCountingSort) {
  MT_SKIP_WITHOUT_CUDA();
  const PermCase cases[] = {
      {1, 1, 1, 1, 8},          // smallest
      {37, 2, 8, 5, 8},         // three empty experts
      {4096, 8, 128, 128, 8},   // Qwen3-30B-A3B routing: 32768 slots, 16 chunks of the counting sort
      {5000, 4, 300, 7, 8},     // most experts empty, skewed load (a few experts get thousands of rows)
      {999, 3, 1024, 1024, 8},  // the expert limit
  };
  for (const PermCase& c : cases) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << " k " << c.k << " E " << c.E);
    auto idx = random_index(c.T, c.k, c.E, c.used, 17 + c.T);
    HostPlan want = host_plan(idx, c.E);
    cuda::MoePlan got = cuda::moe_plan(device_index(c.T, c.k, idx), c.E, stream0());
    EXPECT_EQ(host_ints(got.offsets), want.offsets);
    EXPECT_EQ(host_ints(got.row_of_slot), want.row);
    EXPECT_EQ(host_ints(got.slot_of_row), want.slot);
  }
}

// Gather, combine (weighted and plain, bf16 and fp32 out) and combine backward, for a vectorised
// hidden size and an odd one (element path).
TEST(CudaPermute, GatherCombineAndBackward) {
  MT_SKIP_WITHOUT_CUDA();
  for (const PermCase& c : {PermCase{300, 8, 16, 12, 2048}, PermCase{77, 3, 5, 4, 13}}) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << " k " << c.k << " H " << c.H);
    const int N = c.T * c.k, H = c.H;
    auto idx = random_index(c.T, c.k, c.E, c.used, 5);
    HostPlan hp = host_plan(idx, c.E);
    cuda::MoePlan plan = cuda::moe_plan(device_index(c.T, c.k, idx), c.E, stream0());

    Tensor x = test::host_random({c.T, H}, 1, 1.0f, true);
    Tensor xg = cuda::moe_gather(test::device_from_host(x, DType::BF16), plan, stream0());
    ASSERT_EQ(xg.shape(), Shape({N, H}));
    std::vector<float> xgv = test::device_floats(xg), xv = x.to_floats();
    for (int r = 0; r < N; ++r)
      for (int h = 0; h < H; ++h)
        ASSERT_EQ(xgv[r * H + h], xv[(hp.slot[r] / c.k) * H + h]) << "row " << r << " col " << h;

    // Expert outputs y (grouped rows) and routing weights (bf16 values, as the router makes them).
    Tensor y = test::host_random({N, H}, 2, 1.0f, true);
    Tensor w = test::host_random({c.T, c.k}, 3, 0.3f, true);
    std::vector<float> yv = y.to_floats(), wv = w.to_floats();
    Tensor y_dev = test::device_from_host(y, DType::BF16), w_dev = cuda::to_device(w, 0);
    for (bool weighted : {true, false}) {
      for (DType out_dt : {DType::BF16, DType::F32}) {
        std::vector<float> want(static_cast<size_t>(c.T) * H);
        for (int t = 0; t < c.T; ++t)
          for (int h = 0; h < H; ++h) {
            float acc = 0.0f;
            for (int s = 0; s < c.k; ++s) {
              const float v = yv[static_cast<size_t>(hp.row[t * c.k + s]) * H + h];
              acc += weighted ? round_bf16(v * wv[t * c.k + s]) : v;
            }
            want[t * H + h] = out_dt == DType::BF16 ? round_bf16(acc) : acc;
          }
        Tensor out = Tensor::empty({c.T, H}, out_dt, Device::cuda(0));
        if (weighted)
          cuda::moe_combine(y_dev, w_dev, plan, out, stream0());
        else
          cuda::moe_gather_backward(y_dev, plan, out, stream0());
        EXPECT_EQ(test::device_floats(out), want) << "weighted " << weighted << " out " << (out_dt == DType::F32);
      }
    }

    // Backward of the weighted combine, from a bf16 and from an fp32 gradient.
    for (DType g_dt : {DType::BF16, DType::F32}) {
      Tensor dout = test::host_random({c.T, H}, 4, 1.0f, g_dt == DType::BF16);
      std::vector<float> gv = dout.to_floats();
      Tensor dy = Tensor::empty({N, H}, DType::BF16, Device::cuda(0));
      Tensor dw = Tensor::empty({c.T, c.k}, DType::F32, Device::cuda(0));
      cuda::moe_combine_backward(test::device_from_host(dout, g_dt), y_dev, w_dev, plan, dy, dw, stream0());
      std::vector<float> want_dy(static_cast<size_t>(N) * H), want_dw(N);
      for (int i = 0; i < N; ++i) {
        const int t = i / c.k, r = hp.row[i];
        double dot = 0;
        for (int h = 0; h < H; ++h) {
          want_dy[static_cast<size_t>(r) * H + h] = round_bf16(gv[t * H + h] * wv[i]);
          dot += static_cast<double>(gv[t * H + h]) * yv[static_cast<size_t>(r) * H + h];
        }
        want_dw[i] = static_cast<float>(dot);
      }
      EXPECT_EQ(test::device_floats(dy), want_dy);
      test::expect_norm(test::device_floats(dw), want_dw, 1e-5, 1e-6, "dweights");
      // Without weights the gradient passes through unchanged (rounded to bf16).
      Tensor dy2 = Tensor::empty({N, H}, DType::BF16, Device::cuda(0));
      Tensor unused;
      cuda::moe_combine_backward(test::device_from_host(dout, g_dt), Tensor(), Tensor(), plan, dy2, unused, stream0());
      std::vector<float> dy2v = test::device_floats(dy2);
      for (int i = 0; i < N; ++i)
        for (int h = 0; h < H; ++h)
          ASSERT_EQ(dy2v[static_cast<size_t>(hp.row[i]) * H + h], round_bf16(gv[(i / c.k) * H + h]));
    }
  }
}

// A local plan (expert parallelism by all-gather): each of 4 ranks takes experts [4j, 4j+4) of 16 over every
// token. Its plan is the counting sort of the remapped ids (other ranks' experts in one last bucket); the
// gather fills only the live rows; the combine sums only the live slots (bit for bit as the host does);
// its backward writes only live rows (each bf16(dout·w), as the full plan) and zero weight gradients
// elsewhere; over the 4 ranks every slot is live exactly once.
TEST(CudaPermute, LocalPlanRunsOnlyThisRanksExperts) {
  MT_SKIP_WITHOUT_CUDA();
  const int T = 300, k = 8, E = 16, H = 64, ranks = 4, per = E / ranks;
  auto idx = random_index(T, k, E, E, 23);
  const Tensor idx_dev = device_index(T, k, idx);
  Tensor x = test::host_random({T, H}, 1, 1.0f, true);
  Tensor w = test::host_random({T, k}, 3, 0.3f, true);
  Tensor dout = test::host_random({T, H}, 4, 1.0f, true);
  const Tensor x_dev = test::device_from_host(x, DType::BF16), w_dev = cuda::to_device(w, 0);
  const Tensor dout_dev = test::device_from_host(dout, DType::BF16);
  const std::vector<float> xv = x.to_floats(), wv = w.to_floats(), gv = dout.to_floats();
  std::vector<int> slot_seen(static_cast<size_t>(T) * k, 0);
  std::vector<double> dw_sum(static_cast<size_t>(T) * k, 0.0);
  for (int rank = 0; rank < ranks; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::vector<int32_t> local(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      const int e = idx[i] - rank * per;
      local[i] = e >= 0 && e < per ? e : per;
    }
    HostPlan want = host_plan(local, per + 1);
    cuda::MoePlan plan = cuda::moe_plan_local(idx_dev, E, rank * per, per, stream0());
    ASSERT_TRUE(plan.local());
    EXPECT_EQ(host_ints(plan.offsets), want.offsets);
    EXPECT_EQ(host_ints(plan.row_of_slot), want.row);
    EXPECT_EQ(host_ints(plan.live_offsets()).size(), static_cast<size_t>(per + 1));
    const int live = want.offsets[per];
    EXPECT_GT(live, 0);
    EXPECT_LT(live, T * k);

    // Gather into a buffer with spare rows: rows past `live` keep their marker.
    Tensor xg = test::device_from_host(test::host_random({live + 5, H}, 9, 1.0f, true), DType::BF16);
    const std::vector<float> before = test::device_floats(xg);
    cuda::moe_gather_live(x_dev, plan, xg, stream0());  // the live count read on the device
    const std::vector<float> xgv = test::device_floats(xg);
    for (int r = 0; r < live + 5; ++r)
      for (int h = 0; h < H; ++h) {
        const float expect = r < live ? xv[(want.slot[r] / k) * H + h] : before[static_cast<size_t>(r) * H + h];
        ASSERT_EQ(xgv[static_cast<size_t>(r) * H + h], expect) << "row " << r;
      }

    // Expert outputs for the live rows only; the combine must not read past them.
    Tensor y = test::host_random({live, H}, 5 + rank, 1.0f, true);
    const std::vector<float> yv = y.to_floats();
    const Tensor y_dev = test::device_from_host(y, DType::BF16);
    std::vector<float> want_out(static_cast<size_t>(T) * H), want_sum(static_cast<size_t>(T) * H);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        float acc = 0.0f, plain = 0.0f;
        for (int s = 0; s < k; ++s) {
          const int r = want.row[t * k + s];
          if (r >= live) continue;
          acc += round_bf16(yv[static_cast<size_t>(r) * H + h] * wv[t * k + s]);
          plain += yv[static_cast<size_t>(r) * H + h];
        }
        want_out[t * H + h] = acc;
        want_sum[t * H + h] = round_bf16(plain);
      }
    Tensor out = Tensor::empty({T, H}, DType::F32, Device::cuda(0));
    cuda::moe_combine(y_dev, w_dev, plan, out, stream0());
    EXPECT_EQ(test::device_floats(out), want_out);
    Tensor sum = Tensor::empty({T, H}, DType::BF16, Device::cuda(0));
    cuda::moe_gather_backward(y_dev, plan, sum, stream0());
    EXPECT_EQ(test::device_floats(sum), want_sum);

    // Backward: live rows of dy, zero weight gradients for other ranks' slots.
    Tensor dy = Tensor::empty({live, H}, DType::BF16, Device::cuda(0));
    Tensor dw = Tensor::empty({T, k}, DType::F32, Device::cuda(0));
    cuda::moe_combine_backward(dout_dev, y_dev, w_dev, plan, dy, dw, stream0());
    const std::vector<float> dyv = test::device_floats(dy), dwv = test::device_floats(dw);
    for (int i = 0; i < T * k; ++i) {
      const int t = i / k, r = want.row[i];
      if (r >= live) {
        ASSERT_EQ(dwv[i], 0.0f) << "slot " << i;
        continue;
      }
      ++slot_seen[i];
      dw_sum[i] += dwv[i];
      for (int h = 0; h < H; ++h)
        ASSERT_EQ(dyv[static_cast<size_t>(r) * H + h], round_bf16(gv[t * H + h] * wv[i])) << "slot " << i;
    }
  }
  // Every slot was live on exactly one rank, so summing the ranks' weight gradients (the reduce-scatter)
  // gives each slot its one non-zero value.
  for (int i = 0; i < T * k; ++i) {
    ASSERT_EQ(slot_seen[i], 1) << "slot " << i;
    EXPECT_NE(dw_sum[i], 0.0) << "slot " << i;
  }
  EXPECT_THROW(cuda::moe_plan_local(idx_dev, E, 12, 8, stream0()), Error);  // past the last expert
}

// The all-gather dispatch's row budget (kernels/cuda/ep_row_watch.h): the watch records the live row count
// as a fixed-point ratio to the even share (the maximum over calls) and counts the calls whose count passed
// the capacity; it clamps the live offsets to the capacity, after which the gather fills exactly the budget's
// rows and the combine sums only the slots whose rows fit (the others dropped, as the rerun expects).
TEST(CudaPermute, RowWatchRecordsTheLoadAndClampsALocalPlanToItsBudget) {
  MT_SKIP_WITHOUT_CUDA();
  const int T = 300, k = 8, E = 16, H = 64, ranks = 4, per = E / ranks, rank = 1, share = T * k / ranks;
  const int64_t scale = 4096;
  auto idx = random_index(T, k, E, E, 29);
  const Tensor idx_dev = device_index(T, k, idx);
  std::vector<int32_t> local(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    const int e = idx[i] - rank * per;
    local[i] = e >= 0 && e < per ? e : per;
  }
  const HostPlan want = host_plan(local, per + 1);
  const int live = want.offsets[per];
  ASSERT_GT(live, 20);
  const int32_t load = static_cast<int32_t>((int64_t{live} * scale + share - 1) / share);
  Tensor watch = Tensor::empty({2}, DType::I32, Device::cuda(0));
  MT_CUDA_CHECK(cudaMemsetAsync(watch.data(), 0, 8, stream0()));

  // Within the budget: nothing clamped, the load recorded, no overflow.
  cuda::MoePlan plan = cuda::moe_plan_local(idx_dev, E, rank * per, per, stream0());
  cuda::ep_watch_live_rows(plan, live, share, scale, watch, stream0());
  EXPECT_EQ(host_ints(plan.offsets), want.offsets);
  EXPECT_EQ(host_ints(watch), (std::vector<int32_t>{load, 0}));

  // A larger share gives a smaller load: the maximum stays.
  cuda::MoePlan again = cuda::moe_plan_local(idx_dev, E, rank * per, per, stream0());
  cuda::ep_watch_live_rows(again, T * k, 2 * share, scale, watch, stream0());
  EXPECT_EQ(host_ints(watch), (std::vector<int32_t>{load, 0}));

  // Past the budget: the live offsets clamped to it (the other ranks' bucket keeps its end), one overflow.
  const int cap = live - 7;
  cuda::MoePlan over = cuda::moe_plan_local(idx_dev, E, rank * per, per, stream0());
  cuda::ep_watch_live_rows(over, cap, share, scale, watch, stream0());
  std::vector<int32_t> clamped = want.offsets;
  for (int j = 0; j <= per; ++j) clamped[j] = std::min(clamped[j], cap);
  EXPECT_EQ(host_ints(over.offsets), clamped);
  EXPECT_EQ(clamped[per + 1], T * k);
  EXPECT_EQ(host_ints(watch), (std::vector<int32_t>{load, 1}));

  // The gather fills the budget's rows only; the combine sums the slots whose rows fit.
  Tensor x = test::host_random({T, H}, 31, 1.0f, true);
  const std::vector<float> xv = x.to_floats();
  const Tensor x_dev = test::device_from_host(x, DType::BF16);
  Tensor xg = Tensor::empty({cap, H}, DType::BF16, Device::cuda(0));
  cuda::moe_gather_live(x_dev, over, xg, stream0());
  const std::vector<float> xgv = test::device_floats(xg);
  for (int r = 0; r < cap; ++r)
    for (int h = 0; h < H; ++h) ASSERT_EQ(xgv[static_cast<size_t>(r) * H + h], xv[(want.slot[r] / k) * H + h]) << r;
  Tensor out = Tensor::empty({T, H}, DType::F32, Device::cuda(0));
  cuda::moe_combine(xg, Tensor(), over, out, stream0());
  const std::vector<float> outv = test::device_floats(out);
  int summed = 0;
  for (int t = 0; t < T; ++t) {
    float acc = 0.0f;
    for (int s = 0; s < k; ++s)
      if (want.row[t * k + s] < cap) acc += xgv[static_cast<size_t>(want.row[t * k + s]) * H], ++summed;
    ASSERT_EQ(outv[static_cast<size_t>(t) * H], acc) << "token " << t;
  }
  EXPECT_EQ(summed, cap);
  EXPECT_THROW(cuda::ep_watch_live_rows(plan, -1, share, scale, watch, stream0()), Error);
  cuda::MoePlan full = cuda::moe_plan(idx_dev, E, stream0());
  EXPECT_THROW(cuda::ep_watch_live_rows(full, cap, share, scale, watch, stream0()), Error);  // not a local plan
  EXPECT_THROW(cuda::moe_gather_live(x_dev, full, xg, stream0()), Error);
}

TEST(CudaPermute, BadShapesAreErrors) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor idx = device_index(2, 2, {0, 1, 1, 0});
  EXPECT_THROW(cuda::moe_plan(idx, 0, stream0()), Error);
  EXPECT_THROW(cuda::moe_plan(idx, 1025, stream0()), Error);
  cuda::MoePlan plan = cuda::moe_plan(idx, 2, stream0());
  Tensor x = Tensor::empty({3, 8}, DType::BF16, Device::cuda(0));  // 3 tokens, plan has 2
  EXPECT_THROW(cuda::moe_gather(x, plan, stream0()), Error);
  Tensor xf = Tensor::empty({2, 8}, DType::F32, Device::cuda(0));  // gather wants bf16
  EXPECT_THROW(cuda::moe_gather(xf, plan, stream0()), Error);
}

}  // namespace
}  // namespace mt
