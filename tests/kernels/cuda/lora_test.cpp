// The CUDA LoRA ops (kernels/cuda/lora.h) against the CPU reference (kernels/cpu/lora.h: PEFT's math with fp32
// A and B): dense slots through cuBLASLt and expert stacks through the grouped GEMMs, with odd token counts, empty
// experts and no rows at all; the working copies bit for bit; B = 0 leaves the base output bit for bit.
//
// Tolerances, per element, from the rounding points in kernels/cuda/lora.h (u = 2^-8, one bf16 rounding):
//   S_tk = Σ_i |x_ti·A_ki|, the size of u_tk;  D_to = |s|·Σ_k S_tk·|B_ok|, the size of the adapter's output;
//   G_tk = |s|·Σ_o |dy_to·B_ok|, the size of du_tk.
//   forward  the GPU's u' = bf16(x·bf16(A)ᵀ) is off by <= 2u·S (two roundings), B' = bf16(s·B) by u·|s·B|, so
//            the adapter's output by <= 3u·D (4u·D on the grouped path, which rounds it once more before the
//            add); both sides round y + δ once: 2u·|y| more. Bound 2.1u·|y| + 3.1u·D (grouped 4.2u·D).
//   dB       dy is the same bf16 on both sides; u' is off by 2u·S: 2.1u·|s|·Σ_t |dy_to|·S_tk (grouped: s·u' is
//            rounded too, 3.1u).
//   dA       du' = bf16(dy·B') is off by 2u·G: 2.1u·Σ_t G_tk·|x_ti|.
//   dx       du'·A' is off by 3u·Σ_k G_tk·|A_ki| (grouped 4u: rounded before its add), plus the add's rounding
//            2.1u·|dx|.
// fp32 accumulation (at most a few hundred terms here) adds ~1e-5 relative; each bound gets 1e-5 of its scale
// and an absolute 1e-6. A wrong layout, a missing scale or a dropped expert moves elements by O(D), far outside.
#include "kernels/cuda/lora.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "kernels/cpu/lora.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"

namespace mt {
namespace {

constexpr double kU = 1.0 / 256;  // bf16 unit roundoff

cudaStream_t stream0() { return cuda::device_context(0).stream; }

Tensor device_i32(const std::vector<int32_t>& v) {
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), h.data_as<int32_t>());
  return cuda::to_device(h, 0);
}

std::vector<int32_t> offsets_of(const std::vector<int>& counts) {
  std::vector<int32_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

// Every |got - want| within bound (elementwise), reporting the worst ratio.
void expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(bound.size(), want.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    const double ratio = bound[i] > 0 ? d / bound[i] : (d > 0 ? INFINITY : 0.0);
    if (!(d <= bound[i])) ++bad;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements outside their bound; worst at "
                     << worst << ": got " << (got.empty() ? 0 : got[worst]) << ", want "
                     << (want.empty() ? 0 : want[worst]) << ", bound " << (bound.empty() ? 0 : bound[worst]);
  if (std::getenv("MT_PRINT_ERRORS"))
    std::printf("[ error    ] %s: worst |got-want| / bound = %.3g\n", what.c_str(), worst_ratio);
}

// One adapter over `experts` stacked pairs (0: a dense pair) and the data of one call.
struct Case {
  int64_t E = 0, in = 0, out = 0, r = 0;
  float s = 0;
  std::vector<int> counts;  // rows per expert; a dense case has one entry
  int extra = 0;            // grouped: rows past offsets[E], which must stay untouched
  int64_t N() const {
    int64_t n = extra;
    for (int c : counts) n += c;
    return n;
  }
};

struct Data {
  Tensor x, a, b, y0, dy, dx0;  // host: x, y0, dy, dx0 bf16 values in F32; a, b F32
};

Data make_data(const Case& c, uint64_t seed) {
  const int64_t N = c.N(), E = std::max<int64_t>(c.E, 1);
  Data d;
  d.x = test::host_random({N, c.in}, seed, 1.0f, true);
  d.a = test::host_random({E, c.r, c.in}, seed + 1, 1.0f / std::sqrt(float(c.in)));
  d.b = test::host_random({E, c.out, c.r}, seed + 2, 0.3f);
  d.y0 = test::host_random({N, c.out}, seed + 3, 1.0f, true);
  d.dy = test::host_random({N, c.out}, seed + 4, 1.0f, true);
  d.dx0 = test::host_random({N, c.in}, seed + 5, 1.0f, true);
  return d;
}

// The shape the op takes: [E, ...] for a stack, [...] for a dense pair.
Tensor shaped(const Tensor& t, const Case& c) {
  if (c.E > 0) return t;
  return t.view({t.dim(1), t.dim(2)});
}

struct Operands {
  Tensor a16, b16;
  cuda::LoraOperands ops;
};

Operands upload(const Data& d, const Case& c) {
  Operands o;
  Tensor a = cuda::to_device(shaped(d.a, c), 0), b = cuda::to_device(shaped(d.b, c), 0);
  o.a16 = Tensor::empty(a.shape(), DType::BF16, a.device());
  o.b16 = Tensor::empty(b.shape(), DType::BF16, b.device());
  cuda::lora_working_copy(a, b, c.s, o.a16, o.b16, stream0());
  o.ops = {&o.a16, &o.b16, c.s};
  return o;
}

// The CPU reference and the bounds of one case (the expert of each row from the counts).
struct Reference {
  std::vector<double> y, y_bound, dx, dx_bound, da, da_bound, db, db_bound;
};

Reference reference(const Data& d, const Case& c, bool grouped) {
  const int64_t N = c.N(), in = c.in, out = c.out, r = c.r, E = std::max<int64_t>(c.E, 1);
  const float* x = d.x.data_as<float>();
  const float* A = d.a.data_as<float>();
  const float* B = d.b.data_as<float>();
  std::vector<float> y(d.y0.data_as<float>(), d.y0.data_as<float>() + N * out);
  std::vector<float> dx(d.dx0.data_as<float>(), d.dx0.data_as<float>() + N * in);
  std::vector<float> da(static_cast<size_t>(E * r * in), 0.0f), db(static_cast<size_t>(E * out * r), 0.0f);
  Reference ref;
  ref.y_bound.assign(static_cast<size_t>(N * out), 0);
  ref.dx_bound.assign(static_cast<size_t>(N * in), 0);
  ref.da_bound.assign(da.size(), 0);
  ref.db_bound.assign(db.size(), 0);
  const double as = std::fabs(c.s), fwd = grouped ? 4.2 : 3.1, db_k = grouped ? 3.1 : 2.1, dx_k = grouped ? 4.2 : 3.1;
  int64_t r0 = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = c.counts[static_cast<size_t>(e)];
    const float* Ae = A + e * r * in;
    const float* Be = B + e * out * r;
    cpu::lora_forward_rows(n, in, out, r, x + r0 * in, in, Ae, Be, c.s, y.data() + r0 * out, out);
    cpu::lora_backward_rows(n, in, out, r, x + r0 * in, in, d.dy.data_as<float>() + r0 * out, out, Ae, Be, c.s,
                            dx.data() + r0 * in, in, da.data() + e * r * in, db.data() + e * out * r);
    for (int64_t t = r0; t < r0 + n; ++t) {
      std::vector<double> S(static_cast<size_t>(r), 0), G(static_cast<size_t>(r), 0);
      for (int64_t k = 0; k < r; ++k) {
        for (int64_t i = 0; i < in; ++i) S[k] += std::fabs(double(x[t * in + i]) * Ae[k * in + i]);
        for (int64_t o = 0; o < out; ++o) G[k] += as * std::fabs(double(d.dy.data_as<float>()[t * out + o]) * Be[o * r + k]);
      }
      for (int64_t o = 0; o < out; ++o) {
        double D = 0;
        for (int64_t k = 0; k < r; ++k) D += as * S[k] * std::fabs(Be[o * r + k]);
        ref.y_bound[t * out + o] = fwd * kU * D + 1e-5 * D;
        for (int64_t k = 0; k < r; ++k)
          ref.db_bound[e * out * r + o * r + k] += (db_k * kU + 1e-5) * as * std::fabs(d.dy.data_as<float>()[t * out + o]) * S[k];
      }
      for (int64_t i = 0; i < in; ++i) {
        double P = 0;
        for (int64_t k = 0; k < r; ++k) {
          P += G[k] * std::fabs(Ae[k * in + i]);
          ref.da_bound[e * r * in + k * in + i] += (2.1 * kU + 1e-5) * G[k] * std::fabs(x[t * in + i]);
        }
        ref.dx_bound[t * in + i] = dx_k * kU * P + 1e-5 * P;
      }
    }
    r0 += n;
  }
  // The roundings of y + δ and dx + δx on both sides; the rows past offsets[E] exactly as they were (bound 0).
  for (size_t i = 0; i < y.size(); ++i) {
    const double want = round_bf16(y[i]);
    ref.y.push_back(want);
    if (static_cast<int64_t>(i) < r0 * out) ref.y_bound[i] += 2.1 * kU * std::fabs(want) + 1e-6;
  }
  for (size_t i = 0; i < dx.size(); ++i) {
    ref.dx.push_back(dx[i]);
    if (static_cast<int64_t>(i) < r0 * in) ref.dx_bound[i] += 2.1 * kU * std::fabs(dx[i]) + 1e-6;
  }
  ref.da.assign(da.begin(), da.end());
  ref.db.assign(db.begin(), db.end());
  for (double& b : ref.da_bound) b += 1e-6;
  for (double& b : ref.db_bound) b += 1e-6;
  return ref;
}

void expect_case(const Case& c, uint64_t seed) {
  const bool grouped = c.E > 0;
  SCOPED_TRACE((grouped ? "grouped E " + std::to_string(c.E) : std::string("dense")) + ", N " + std::to_string(c.N()) +
               ", in " + std::to_string(c.in) + ", out " + std::to_string(c.out) + ", r " + std::to_string(c.r));
  const Data d = make_data(c, seed);
  const Reference ref = reference(d, c, grouped);
  const Operands o = upload(d, c);
  Tensor x = test::device_from_host(d.x, DType::BF16);
  Tensor y = test::device_from_host(d.y0, DType::BF16);
  Tensor dy = test::device_from_host(d.dy, DType::BF16);
  Tensor dx = test::device_from_host(d.dx0, DType::BF16);
  Tensor da = Tensor::empty(o.a16.shape(), DType::F32, x.device()), db = Tensor::empty(o.b16.shape(), DType::F32, x.device());
  cuda::fill_zero_async(da, stream0());
  cuda::fill_zero_async(db, stream0());
  const cuda::LoraGrads g{&da, &db};
  if (grouped) {
    const Tensor offsets = device_i32(offsets_of(c.counts));
    const Tensor u = cuda::lora_grouped_forward(x, offsets, o.ops, y, stream0());
    cuda::lora_grouped_backward(dy, x, u, offsets, o.ops, dx, g, stream0());
  } else {
    const Tensor u = cuda::lora_forward(x, o.ops, y, stream0());
    cuda::lora_backward(dy, x, u, o.ops, dx, g, stream0());
  }
  expect_within(test::device_floats(y), ref.y, ref.y_bound, "y");
  expect_within(test::device_floats(dx), ref.dx, ref.dx_bound, "dx");
  const std::vector<float> got_da = test::device_floats(da), got_db = test::device_floats(db);
  expect_within(got_da, ref.da, ref.da_bound, "dA");
  expect_within(got_db, ref.db, ref.db_bound, "dB");
  // An expert without rows gets nothing (its gradients stay exactly zero).
  for (size_t e = 0; grouped && e < c.counts.size(); ++e) {
    if (c.counts[e] != 0) continue;
    for (int64_t i = 0; i < c.r * c.in; ++i) ASSERT_EQ(got_da[e * c.r * c.in + i], 0.0f) << "dA of empty expert " << e;
    for (int64_t i = 0; i < c.out * c.r; ++i) ASSERT_EQ(got_db[e * c.out * c.r + i], 0.0f) << "dB of empty expert " << e;
  }
}

TEST(CudaLora, DenseMatchesCpuWithinRoundingBounds) {
  MT_SKIP_WITHOUT_CUDA();
  expect_case({0, 64, 48, 16, 1.7f, {37}}, 1);    // odd token count
  expect_case({0, 136, 200, 8, 2.0f, {130}}, 2);  // sizes that are not tile multiples
  expect_case({0, 64, 48, 4, 0.75f, {9}}, 3);     // r 4: the dense path takes any rank
  expect_case({0, 64, 48, 16, 1.7f, {0}}, 4);     // no tokens: nothing changes
}

TEST(CudaLora, GroupedMatchesCpuWithEmptyExpertsAndOddCounts) {
  MT_SKIP_WITHOUT_CUDA();
  expect_case({6, 64, 48, 16, 1.7f, {5, 0, 17, 1, 0, 33}}, 11);
  expect_case({3, 136, 200, 8, 2.0f, {129, 0, 3}, 5}, 12);  // 5 rows past offsets[E]: untouched
  expect_case({4, 64, 48, 16, 2.0f, {0, 0, 0, 0}, 3}, 13);  // no expert rows at all
  expect_case({2, 2048, 64, 16, 2.0f, {300, 211}}, 14);  // Qwen3-30B-A3B's hidden size as the input
}

// The working copies are bf16(A) and bf16(s·B) exactly (round to nearest even, as the host rounds).
TEST(CudaLora, WorkingCopiesRoundOnce) {
  MT_SKIP_WITHOUT_CUDA();
  const float s = 1.7f;
  const Tensor a = test::host_random({3, 16, 40}, 21), b = test::host_random({3, 24, 16}, 22);
  Tensor a16 = Tensor::empty(a.shape(), DType::BF16, Device::cuda(0)), b16 = Tensor::empty(b.shape(), DType::BF16, Device::cuda(0));
  cuda::lora_working_copy(cuda::to_device(a, 0), cuda::to_device(b, 0), s, a16, b16, stream0());
  const std::vector<float> ga = test::device_floats(a16), gb = test::device_floats(b16);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(ga[i], round_bf16(a.data_as<float>()[i])) << "A' at " << i;
  for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(gb[i], round_bf16(s * b.data_as<float>()[i])) << "B' at " << i;
}

// B = 0 (PEFT's init): y + 0 rounds to y, so the adapted output is the base output bit for bit, on both paths.
TEST(CudaLora, ZeroBLeavesTheBaseOutputBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  for (int64_t E : {0, 5}) {
    SCOPED_TRACE(E == 0 ? "dense" : "grouped");
    Case c{E, 64, 48, 16, 2.0f, E == 0 ? std::vector<int>{41} : std::vector<int>{7, 0, 20, 1, 13}};
    Data d = make_data(c, 31);
    std::fill(d.b.data_as<float>(), d.b.data_as<float>() + d.b.numel(), 0.0f);
    const Operands o = upload(d, c);
    Tensor x = test::device_from_host(d.x, DType::BF16);
    Tensor y = test::device_from_host(d.y0, DType::BF16);
    if (E > 0)
      cuda::lora_grouped_forward(x, device_i32(offsets_of(c.counts)), o.ops, y, stream0());
    else
      cuda::lora_forward(x, o.ops, y, stream0());
    const std::vector<float> got = test::device_floats(y);
    for (int64_t i = 0; i < d.y0.numel(); ++i) ASSERT_EQ(got[i], d.y0.data_as<float>()[i]) << "y at " << i;
  }
}

// An expert-stacked adapter of a rank the grouped GEMMs cannot take is refused with one line naming r.
TEST(CudaLora, GroupedRefusesRankNotMultipleOfEight) {
  MT_SKIP_WITHOUT_CUDA();
  Case c{2, 64, 48, 4, 1.0f, {3, 4}};
  const Data d = make_data(c, 41);
  const Operands o = upload(d, c);
  Tensor x = test::device_from_host(d.x, DType::BF16), y = test::device_from_host(d.y0, DType::BF16);
  try {
    cuda::lora_grouped_forward(x, device_i32(offsets_of(c.counts)), o.ops, y, stream0());
    FAIL() << "r = 4 on experts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt
