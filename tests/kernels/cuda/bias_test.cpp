// CUDA bias ops (kernels/cuda/bias.h) against the CPU: the dense bias gradient against cpu::bias_backward, the
// grouped (per-expert) bias add and gradient against the same per-expert steps of cpu::experts_* (rows += bias[e],
// rounded in bf16; dbias[e] += Σ rows, here cpu::bias_backward over each expert's rows).
//
// Thresholds:
// - bias add: one fp32 add and one round-to-nearest-even on both sides, so the bits must agree (checked exactly);
//   padding rows and rows of other experts are compared bit for bit too.
// - bias gradients: fp32 column sums of N values in two different orders (the CPU adds row by row into db; the GPU
//   sums 128-row chunks in 8 interleaved streams and adds the chunk sums in order). Each order's rounding error is
//   ~u·√N·‖column‖ typically (u = 6e-8), ≤ u·N·Σ|x| at worst; with N ≤ 8192 standard-normal rows that is ~1e-5 of
//   the column's norm, and the sums themselves are ~√N: max-norm (against the largest |db|) 2e-5, rel-L2 5e-6.
//   The starting db is non-zero, so "+=" is checked as well.
// - determinism: the same call twice gives the same bits (the chunking depends on N and the offsets only).
#include "kernels/cuda/bias.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"

namespace mt {
namespace {

cudaStream_t stream0() { return cuda::device_context(0).stream; }

Tensor device_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return cuda::to_device(t, 0);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Expert offsets over `rows` routed rows of N: experts get uneven counts, some none (the first, the last, and two
// neighbours in the middle), so the ranges exercise empty experts at both ends and a chunk boundary inside runs.
std::vector<int32_t> uneven_offsets(int E, int64_t rows) {
  std::vector<double> share(E);
  double total = 0;
  for (int e = 0; e < E; ++e) {
    const bool empty = e == 0 || e == E - 1 || e == E / 2 || e == E / 2 + 1;
    share[e] = empty ? 0.0 : 1.0 + (e * 7 % 5);
    total += share[e];
  }
  std::vector<int32_t> off(E + 1, 0);
  double acc = 0;
  for (int e = 0; e < E; ++e) {
    acc += share[e];
    off[e + 1] = total > 0 ? static_cast<int32_t>(rows * acc / total + 0.5) : 0;
  }
  off[E] = static_cast<int32_t>(rows);
  return off;
}

// ---- dense bias gradient ----

void dense_backward_case(int64_t N, int64_t C, DType dt, uint64_t seed) {
  const std::string what = std::string(dt == DType::BF16 ? "bf16" : "f32") + " N=" + std::to_string(N) +
                           " C=" + std::to_string(C);
  Tensor dy = test::host_random({N, C}, seed, 1.0f, dt == DType::BF16);
  Tensor db0 = test::host_random({C}, seed + 1, 1.0f);
  Tensor want = db0.clone();
  cpu::bias_backward(dy, want);
  Tensor ddy = test::device_from_host(dy, dt);
  Tensor got = cuda::to_device(db0, 0);
  cuda::bias_backward(ddy, got, stream0());
  const std::vector<float> g1 = test::device_floats(got);
  test::expect_norm(g1, want.to_floats(), 2e-5, 5e-6, what + " db");
  Tensor again = cuda::to_device(db0, 0);
  cuda::bias_backward(ddy, again, stream0());
  EXPECT_TRUE(same_bits(test::device_floats(again), g1)) << what << ": a repeat gave other bits";
}

TEST(CudaBias, BackwardMatchesCpuAndRepeatsBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 4100;
  const std::pair<int64_t, int64_t> shapes[] = {
      {1, 1},       // one element
      {37, 33},     // C not a multiple of 8: the scalar path
      {300, 32},    // GPT-OSS's router bias (E = 32 columns)
      {129, 512},   // a k/v projection's width, a partial chunk
      {8192, 2880}, // hidden-size rows over 64 chunks
      {0, 16},      // no rows: db unchanged
  };
  for (DType dt : {DType::BF16, DType::F32})
    for (const auto& [N, C] : shapes) dense_backward_case(N, C, dt, seed += 10);
}

TEST(CudaBias, BackwardTakesAnyLeadingShape) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor dy = test::host_random({3, 5, 16}, 4200, 1.0f, true);
  Tensor want = Tensor::from_floats({16}, std::vector<float>(16, 0.0f));
  cpu::bias_backward(dy.view({15, 16}), want);
  Tensor got = cuda::to_device(Tensor::from_floats({16}, std::vector<float>(16, 0.0f)), 0);
  cuda::bias_backward(test::device_from_host(dy, DType::BF16), got, stream0());
  test::expect_norm(test::device_floats(got), want.to_floats(), 2e-5, 5e-6, "[3, 5, 16] dy");
  Tensor bad = Tensor::empty({15}, DType::F32, Device::cuda(0));
  EXPECT_THROW(cuda::bias_backward(test::device_from_host(dy, DType::BF16), bad, stream0()), Error);
}

// ---- grouped bias ----

struct GroupedCase {
  int64_t N;    // rows of the grouped buffer
  int64_t rows; // rows routed to experts (offsets[E]); N − rows padding rows
  int64_t C;
  int E;
};

const GroupedCase kGrouped[] = {
    {1000, 937, 2880, 32},   // GPT-OSS-20b's experts (E = 32, down projection width), 63 padding rows
    {517, 517, 5760, 32},    // the gate_up width 2·2880, no padding
    {300, 250, 100, 8},      // C not a multiple of 8: the scalar path
    {4096, 4000, 64, 6},     // two wide experts spanning many chunks
    {40, 0, 24, 3},          // nothing routed: everything is padding
    {0, 0, 16, 5},           // N = 0
};

std::string case_name(const GroupedCase& c, DType y, DType b) {
  return std::string(y == DType::BF16 ? "y bf16" : "y f32") + (b == DType::BF16 ? " bias bf16" : " bias f32") +
         " N=" + std::to_string(c.N) + " rows=" + std::to_string(c.rows) + " C=" + std::to_string(c.C) +
         " E=" + std::to_string(c.E);
}

TEST(CudaBias, GroupedAddMatchesCpuBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 4300;
  for (const GroupedCase& c : kGrouped) {
    const std::vector<int32_t> off = uneven_offsets(c.E, c.rows);
    for (DType ydt : {DType::BF16, DType::F32}) {
      for (DType bdt : {DType::BF16, DType::F32}) {
        const std::string what = case_name(c, ydt, bdt);
        // Values representable in each dtype, so host and device add the same numbers.
        Tensor y = test::host_random({c.N, c.C}, seed += 10, 3.0f, ydt == DType::BF16);
        Tensor bias = test::host_random({c.E, c.C}, seed + 1, 1.0f, bdt == DType::BF16);
        std::vector<float> want = y.to_floats();
        const std::vector<float> bv = bias.to_floats();
        for (int e = 0; e < c.E; ++e)  // experts.cpp add_bias_rows: rows += bias, rounded in bf16 mode
          for (int64_t r = off[e]; r < off[e + 1]; ++r)
            for (int64_t i = 0; i < c.C; ++i) {
              const float v = want[r * c.C + i] + bv[e * c.C + i];
              want[r * c.C + i] = ydt == DType::BF16 ? round_bf16(v) : v;
            }
        Tensor dy_ = test::device_from_host(y, ydt);
        cuda::grouped_bias_add(dy_, test::device_from_host(bias, bdt), device_i32(off), stream0());
        const std::vector<float> got = test::device_floats(dy_);
        ASSERT_EQ(got.size(), want.size()) << what;
        size_t diff = 0, first = 0;
        for (size_t i = 0; i < got.size(); ++i)
          if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && diff++ == 0) first = i;
        EXPECT_EQ(diff, 0u) << what << ": " << diff << " elements differ, first at row " << first / c.C
                            << " column " << first % c.C << " (got " << got[first] << " want " << want[first] << ")";
      }
    }
  }
}

TEST(CudaBias, GroupedBackwardMatchesCpuAndRepeatsBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 4500;
  for (const GroupedCase& c : kGrouped) {
    const std::vector<int32_t> off = uneven_offsets(c.E, c.rows);
    for (DType dt : {DType::BF16, DType::F32}) {
      const std::string what = case_name(c, dt, DType::F32);
      std::vector<float> dyv = test::host_random({c.N, c.C}, seed += 10, 1.0f, dt == DType::BF16).to_floats();
      for (int64_t r = c.rows; r < c.N; ++r)  // padding rows: huge values that would show in any sum
        for (int64_t i = 0; i < c.C; ++i) dyv[r * c.C + i] = 1e30f;
      Tensor dy = Tensor::from_floats({c.N, c.C}, dyv);
      Tensor db0 = test::host_random({c.E, c.C}, seed + 1, 1.0f);
      Tensor want = db0.clone();
      for (int e = 0; e < c.E; ++e) {
        Tensor db_e = want.rows(e, e + 1).view({c.C});
        cpu::bias_backward(dy.rows(off[e], off[e + 1]), db_e);
      }
      Tensor ddy = test::device_from_host(dy, dt);
      Tensor doff = device_i32(off);
      Tensor got = cuda::to_device(db0, 0);
      cuda::grouped_bias_backward(ddy, doff, got, stream0());
      const std::vector<float> g1 = test::device_floats(got);
      test::expect_norm(g1, want.to_floats(), 2e-5, 5e-6, what + " dbias");
      const std::vector<float> w0 = db0.to_floats();
      for (int e = 0; e < c.E; ++e) {
        if (off[e] != off[e + 1]) continue;
        EXPECT_TRUE(std::memcmp(&g1[e * c.C], &w0[e * c.C], c.C * sizeof(float)) == 0)
            << what << ": expert " << e << " has no rows but its gradient changed";
      }
      Tensor again = cuda::to_device(db0, 0);
      cuda::grouped_bias_backward(ddy, doff, again, stream0());
      EXPECT_TRUE(same_bits(test::device_floats(again), g1)) << what << ": a repeat gave other bits";
    }
  }
}

TEST(CudaBias, GroupedRejectsBadShapes) {
  MT_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  Tensor y = Tensor::empty({10, 8}, DType::BF16, d);
  Tensor off = device_i32({0, 4, 10});
  EXPECT_THROW(cuda::grouped_bias_add(y, Tensor::empty({3, 8}, DType::BF16, d), off, stream0()), Error);  // E
  EXPECT_THROW(cuda::grouped_bias_add(y, Tensor::empty({2, 7}, DType::BF16, d), off, stream0()), Error);  // C
  EXPECT_THROW(cuda::grouped_bias_add(y, Tensor::empty({2, 8}, DType::BF16, d), device_i32({0}), stream0()),
               Error);  // no experts
  Tensor db = Tensor::empty({2, 8}, DType::BF16, d);
  EXPECT_THROW(cuda::grouped_bias_backward(y, off, db, stream0()), Error);  // dbias must be F32
  Tensor off64 = cuda::to_device(Tensor::empty({3}, DType::I64), 0);
  Tensor db32 = Tensor::empty({2, 8}, DType::F32, d);
  EXPECT_THROW(cuda::grouped_bias_backward(y, off64, db32, stream0()), Error);  // offsets must be I32
}

}  // namespace
}  // namespace mt
