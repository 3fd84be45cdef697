// Nemotron-H's CPU ops (kernels/cpu/{relu2, conv1d_causal, rmsnorm_gated, ssd_scan}.h) against naive
// double-precision transcriptions of what Transformers 5.17 computes (ReLUSquaredActivation, nn.Conv1d with
// padding K−1 cut to S, Zamba2RMSNormGated with norm_before_gate=False, the Mamba2 recurrence), and every backward
// against central differences (h = 1e-6) of those references: loss = Σ out ⊙ R for a random R, so dout = R.
//
// Tolerances: the fp32 ops round each product and sum (≤ ~1e-6 relative over these short sums); the references'
// central differences are good to ~1e-9. Forward: 1e-5 · max|want| + 1e-6; gradients: 1e-4 · max|g| + 1e-6 (as the
// other op tests). The scan accumulates over up to 40 steps of products, still far inside these bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "kernels/cpu/conv1d_causal.h"
#include "kernels/cpu/relu2.h"
#include "kernels/cpu/rmsnorm_gated.h"
#include "kernels/cpu/seq_segments.h"
#include "kernels/cpu/ssd_scan.h"
#include "op_check.h"

namespace mt {
namespace {

using cpu::SeqSegment;
using test::expect_close;
using test::f32;
using test::numeric_grad;
using test::random_floats;
using test::to_double;

constexpr double kFwdRtol = 1e-5, kGradRtol = 1e-4, kAtol = 1e-6;

double weighted(const std::vector<double>& out, const std::vector<double>& r) { return test::dot(out, r); }

// Row 0 one sequence of 11 tokens; row 1 two packed documents of 4 and 7.
const std::vector<SeqSegment> kSegs = {{0, 11}, {11, 4}, {15, 7}};
constexpr int64_t kTokens = 22;

TEST(SeqSegments, RowsAndDocuments) {
  const auto rows = cpu::row_segments(2, 5);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].start, 5);
  EXPECT_EQ(rows[1].length, 5);
  Tensor doc = Tensor::empty({2, 5}, DType::I32);
  const int32_t ids[10] = {0, 0, 1, 1, 1, 0, 1, 2, 2, 2};
  std::copy(ids, ids + 10, doc.data_as<int32_t>());
  const auto docs = cpu::document_segments(doc, 2, 5);
  ASSERT_EQ(docs.size(), 5u);
  const int64_t want[5][2] = {{0, 2}, {2, 3}, {5, 1}, {6, 1}, {7, 3}};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(docs[i].start, want[i][0]) << i;
    EXPECT_EQ(docs[i].length, want[i][1]) << i;
  }
  EXPECT_EQ(cpu::document_segments(Tensor(), 2, 5).size(), 2u);
}

// ---------------------------------------------------------------------------------------------------------------
TEST(Relu2, ForwardBackwardMatchReference) {
  const int64_t N = 7, F = 9;
  std::vector<float> u = random_floats(N * F, 1);
  u[3] = 0.0f;  // relu's kink: both sides give 0 there
  const std::vector<float> r = random_floats(N * F, 2);
  const Tensor out = cpu::relu2_forward(f32({N, F}, u), false);
  auto ref = [&](const std::vector<double>& x) {
    std::vector<double> o(x.size());
    for (size_t i = 0; i < x.size(); ++i) o[i] = x[i] > 0 ? x[i] * x[i] : 0.0;
    return o;
  };
  expect_close(out.to_floats(), ref(to_double(u)), kFwdRtol, kAtol, "relu2");
  const Tensor du = cpu::relu2_backward(f32({N, F}, r), f32({N, F}, u));
  std::vector<double> want = numeric_grad([&](const std::vector<double>& x) { return weighted(ref(x), to_double(r)); },
                                          to_double(u));
  want[3] = 0.0;  // the kink: the central difference sees h², the gradient is 0
  expect_close(du.to_floats(), want, kGradRtol, kAtol, "relu2 du");
  // bf16: the square rounded once.
  const Tensor o16 = cpu::relu2_forward(f32({1, 1}, {1.00390625f}), true);  // (1 + 2^-8)² = 1 + 2^-7 + 2^-16
  EXPECT_EQ(o16.to_floats()[0], 1.0078125f);
}

// ---------------------------------------------------------------------------------------------------------------
std::vector<double> conv_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                             int64_t C, int64_t K) {
  std::vector<double> y(x.size(), 0.0);
  for (const SeqSegment& s : kSegs)
    for (int64_t i = 0; i < s.length; ++i)
      for (int64_t c = 0; c < C; ++c) {
        double acc = b.empty() ? 0.0 : b[c];
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = i - (K - 1) + j;
          if (src >= 0) acc += w[c * K + j] * x[(s.start + src) * C + c];
        }
        y[(s.start + i) * C + c] = acc;
      }
  return y;
}

TEST(Conv1dCausal, ForwardBackwardMatchReference) {
  const int64_t C = 5, K = 4;
  const std::vector<float> x = random_floats(kTokens * C, 3), w = random_floats(C * K, 4, 0.5f),
                           b = random_floats(C, 5), r = random_floats(kTokens * C, 6);
  const Tensor xt = f32({kTokens, C}, x), wt = f32({C, 1, K}, w), bt = f32({C}, b);
  const auto xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);
  expect_close(cpu::conv1d_causal_forward(xt, wt, bt, kSegs, false).to_floats(), conv_ref(xd, wd, bd, C, K), kFwdRtol,
               kAtol, "conv1d");
  expect_close(cpu::conv1d_causal_forward(xt, wt, Tensor(), kSegs, false).to_floats(), conv_ref(xd, wd, {}, C, K),
               kFwdRtol, kAtol, "conv1d without bias");
  Tensor dw = Tensor::zeros({C, 1, K}, DType::F32), db = Tensor::zeros({C}, DType::F32);
  const Tensor dx = cpu::conv1d_causal_backward(f32({kTokens, C}, r), xt, wt, kSegs, &dw, &db);
  expect_close(dx.to_floats(),
               numeric_grad([&](const std::vector<double>& v) { return weighted(conv_ref(v, wd, bd, C, K), rd); }, xd),
               kGradRtol, kAtol, "conv1d dx");
  expect_close(dw.to_floats(),
               numeric_grad([&](const std::vector<double>& v) { return weighted(conv_ref(xd, v, bd, C, K), rd); }, wd),
               kGradRtol, kAtol, "conv1d dw");
  expect_close(db.to_floats(),
               numeric_grad([&](const std::vector<double>& v) { return weighted(conv_ref(xd, wd, v, C, K), rd); }, bd),
               kGradRtol, kAtol, "conv1d db");
  // Accumulates into the parameter gradients; a null dw / db is skipped.
  cpu::conv1d_causal_backward(f32({kTokens, C}, r), xt, wt, kSegs, &dw, nullptr);
  const std::vector<float> twice = dw.to_floats();
  Tensor dw1 = Tensor::zeros({C, 1, K}, DType::F32);
  cpu::conv1d_causal_backward(f32({kTokens, C}, r), xt, wt, kSegs, &dw1, nullptr);
  for (size_t i = 0; i < twice.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * dw1.to_floats()[i]);
  // A packed document starts from an empty window: its first output is w[K−1]·x + b only.
  const std::vector<float> y = cpu::conv1d_causal_forward(xt, wt, bt, kSegs, false).to_floats();
  EXPECT_FLOAT_EQ(y[15 * C + 2], w[2 * K + K - 1] * x[15 * C + 2] + b[2]);
}

// ---------------------------------------------------------------------------------------------------------------
std::vector<double> gated_ref(const std::vector<double>& y, const std::vector<double>& z, const std::vector<double>& w,
                              int64_t n, int64_t group, double eps) {
  std::vector<double> out(y.size());
  for (size_t r = 0; r < y.size() / n; ++r)
    for (int64_t g = 0; g < n / group; ++g) {
      double ss = 0;
      std::vector<double> t(group);
      for (int64_t i = 0; i < group; ++i) {
        const size_t k = r * n + g * group + i;
        t[i] = y[k] * z[k] / (1 + std::exp(-z[k]));
        ss += t[i] * t[i];
      }
      const double rs = 1 / std::sqrt(ss / group + eps);
      for (int64_t i = 0; i < group; ++i) out[r * n + g * group + i] = w[g * group + i] * t[i] * rs;
    }
  return out;
}

TEST(RmsnormGated, ForwardBackwardMatchReference) {
  const int64_t rows = 5, n = 12, group = 4;
  const float eps = 1e-5f;
  const std::vector<float> y = random_floats(rows * n, 7), z = random_floats(rows * n, 8, 2.0f),
                           w = random_floats(n, 9), r = random_floats(rows * n, 10);
  const auto yd = to_double(y), zd = to_double(z), wd = to_double(w), rd = to_double(r);
  const Tensor yt = f32({rows, n}, y), zt = f32({rows, n}, z), wt = f32({n}, w);
  expect_close(cpu::rmsnorm_gated_forward(yt, zt, wt, group, eps).to_floats(), gated_ref(yd, zd, wd, n, group, eps),
               kFwdRtol, kAtol, "gated rmsnorm");
  Tensor dy, dz, dw = Tensor::zeros({n}, DType::F32);
  cpu::rmsnorm_gated_backward(f32({rows, n}, r), yt, zt, wt, group, eps, dy, dz, dw);
  auto loss = [&](const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& c) {
    return weighted(gated_ref(a, b, c, n, group, eps), rd);
  };
  expect_close(dy.to_floats(), numeric_grad([&](const std::vector<double>& v) { return loss(v, zd, wd); }, yd),
               kGradRtol, kAtol, "gated rmsnorm dy");
  expect_close(dz.to_floats(), numeric_grad([&](const std::vector<double>& v) { return loss(yd, v, wd); }, zd),
               kGradRtol, kAtol, "gated rmsnorm dz");
  expect_close(dw.to_floats(), numeric_grad([&](const std::vector<double>& v) { return loss(yd, zd, v); }, wd),
               kGradRtol, kAtol, "gated rmsnorm dw");
  // The groups normalise separately: scaling one group's inputs leaves the others' outputs unchanged.
  std::vector<float> y2 = y;
  for (int64_t i = 0; i < group; ++i) y2[i] *= 3.0f;
  const auto a = cpu::rmsnorm_gated_forward(yt, zt, wt, group, eps).to_floats();
  const auto b = cpu::rmsnorm_gated_forward(f32({rows, n}, y2), zt, wt, group, eps).to_floats();
  for (int64_t i = group; i < n; ++i) EXPECT_EQ(a[i], b[i]) << i;
  // bf16_input (a bf16 scan output, Transformers' decode step): the normalised value is rounded to bf16, then its
  // product with the weight.
  const auto c = cpu::rmsnorm_gated_forward(yt, zt, wt, group, eps, true).to_floats();
  for (int64_t i = 0; i < rows * n; ++i) {
    double ss = 0;
    const int64_t g0 = i / group * group;
    for (int64_t k = g0; k < g0 + group; ++k) {
      const double t = double(y[k]) * (z[k] / (1 + std::exp(-double(z[k]))));
      ss += t * t;
    }
    const double u = double(y[i]) * (z[i] / (1 + std::exp(-double(z[i])))) / std::sqrt(ss / group + eps);
    // One bf16 rounding of u and one of the product, each within 2^-8 relative (8 significant bits, to nearest):
    // within 2^-7 of the exact value.
    EXPECT_NEAR(c[i], w[i % n] * u, std::fabs(w[i % n] * u) * 0x1p-7 + 1e-7) << i;
    EXPECT_EQ(c[i], round_bf16(c[i])) << i;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The scan: 4 heads x 3 channels in 2 groups, state 5.
constexpr int64_t H = 4, P = 3, G = 2, N = 5;

struct ScanData {
  std::vector<double> x, dt, A, B, C, D;
};

ScanData scan_data(uint64_t seed) {
  ScanData s;
  s.x = to_double(random_floats(kTokens * H * P, seed));
  for (float v : random_floats(kTokens * H, seed + 1)) s.dt.push_back(0.05 + 0.4 / (1 + std::exp(-v)));
  for (float v : random_floats(H, seed + 2)) s.A.push_back(-std::exp(0.5 * v));
  s.B = to_double(random_floats(kTokens * G * N, seed + 3, 0.7f));
  s.C = to_double(random_floats(kTokens * G * N, seed + 4, 0.7f));
  s.D = to_double(random_floats(H, seed + 5));
  return s;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

cpu::SsdInputs scan_inputs(const ScanData& s) {
  return {f32({kTokens, H, P}, to_float(s.x)), f32({kTokens, H}, to_float(s.dt)), f32({H}, to_float(s.A)),
          f32({kTokens, G, N}, to_float(s.B)), f32({kTokens, G, N}, to_float(s.C)), f32({H}, to_float(s.D))};
}

// The Mamba2 recurrence in double, per segment and head.
std::vector<double> scan_ref(const ScanData& s) {
  std::vector<double> y(kTokens * H * P, 0.0);
  for (const SeqSegment& seg : kSegs)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      std::vector<double> S(P * N, 0.0);
      for (int64_t t = seg.start; t < seg.start + seg.length; ++t) {
        const double dt = s.dt[t * H + h], decay = std::exp(s.A[h] * dt);
        for (int64_t p = 0; p < P; ++p) {
          double acc = 0;
          for (int64_t n = 0; n < N; ++n) {
            double& st = S[p * N + n];
            st = decay * st + dt * s.x[(t * H + h) * P + p] * s.B[(t * G + g) * N + n];
            acc += s.C[(t * G + g) * N + n] * st;
          }
          y[(t * H + h) * P + p] = acc + s.D[h] * s.x[(t * H + h) * P + p];
        }
      }
    }
  return y;
}

void expect_scan_grads(const cpu::SsdGrads& g, const ScanData& s, const std::vector<double>& r, const char* form) {
  SCOPED_TRACE(form);
  auto grad_of = [&](std::vector<double> ScanData::*field) {
    return numeric_grad(
        [&](const std::vector<double>& v) {
          ScanData t = s;
          t.*field = v;
          return weighted(scan_ref(t), r);
        },
        s.*field);
  };
  expect_close(g.dx.to_floats(), grad_of(&ScanData::x), kGradRtol, kAtol, "dx");
  expect_close(g.ddt.to_floats(), grad_of(&ScanData::dt), kGradRtol, kAtol, "ddt");
  expect_close(g.dA.to_floats(), grad_of(&ScanData::A), kGradRtol, kAtol, "dA");
  expect_close(g.dB.to_floats(), grad_of(&ScanData::B), kGradRtol, kAtol, "dB");
  expect_close(g.dC.to_floats(), grad_of(&ScanData::C), kGradRtol, kAtol, "dC");
  expect_close(g.dD.to_floats(), grad_of(&ScanData::D), kGradRtol, kAtol, "dD");
}

TEST(SsdScan, SequentialMatchesTheRecurrence) {
  const ScanData s = scan_data(20);
  const std::vector<double> r = to_double(random_floats(kTokens * H * P, 30));
  const cpu::SsdShape shape{H, P, G, N, 0};
  expect_close(cpu::ssd_scan_sequential_forward(shape, scan_inputs(s), kSegs).to_floats(), scan_ref(s), kFwdRtol, kAtol,
               "sequential y");
  expect_scan_grads(cpu::ssd_scan_sequential_backward(shape, scan_inputs(s), f32({kTokens, H, P}, to_float(r)), kSegs),
                    s, r, "sequential");
}

// Chunks of 4 over segments of 11 (two full chunks and a partial one), 4 (exactly one) and 7; also one chunk per
// segment (chunk 16) and one token per chunk (chunk 1): the state passing between chunks carries everything.
TEST(SsdScan, ChunkedMatchesTheRecurrence) {
  const ScanData s = scan_data(40);
  const std::vector<double> r = to_double(random_floats(kTokens * H * P, 50));
  for (int64_t chunk : {4, 16, 1, 3}) {
    SCOPED_TRACE(chunk);
    const cpu::SsdShape shape{H, P, G, N, chunk};
    expect_close(cpu::ssd_scan_chunked_forward(shape, scan_inputs(s), kSegs).to_floats(), scan_ref(s), kFwdRtol,
                 kAtol, "chunked y");
    expect_scan_grads(cpu::ssd_scan_chunked_backward(shape, scan_inputs(s), f32({kTokens, H, P}, to_float(r)), kSegs),
                      s, r, "chunked");
  }
}

// The chunked form's final state (what a decode cache continues from) is the recurrence's S after the segment's last
// token: one segment of 22 tokens in chunks of 4 (a partial last chunk), 22 (one chunk) and 1.
TEST(SsdScan, ChunkedFinalStateIsTheRecurrencesLastState) {
  const ScanData s = scan_data(70);
  const SeqSegment seg{0, kTokens};
  std::vector<double> want(H * P * N, 0.0);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / G);
    for (int64_t t = seg.start; t < seg.start + seg.length; ++t) {
      const double dt = s.dt[t * H + h], decay = std::exp(s.A[h] * dt);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t n = 0; n < N; ++n) {
          double& st = want[(h * P + p) * N + n];
          st = decay * st + dt * s.x[(t * H + h) * P + p] * s.B[(t * G + g) * N + n];
        }
    }
  }
  for (int64_t chunk : {4, 22, 1}) {
    SCOPED_TRACE(chunk);
    Tensor state;
    const Tensor y = cpu::ssd_scan_chunked_forward({H, P, G, N, chunk}, scan_inputs(s), {seg}, &state);
    EXPECT_EQ(state.shape(), Shape({H, P, N}));
    expect_close(state.to_floats(), want, kFwdRtol, kAtol, "final state");
    // The output is the one without a final state.
    EXPECT_EQ(y.to_floats(), cpu::ssd_scan_chunked_forward({H, P, G, N, chunk}, scan_inputs(s), {seg}).to_floats());
  }
  Tensor state;
  EXPECT_THROW(cpu::ssd_scan_chunked_forward({H, P, G, N, 4}, scan_inputs(s), kSegs, &state), Error);
}

// A long segment with strong decay (exp(segsum) spans many orders of magnitude and underflows across chunks): the two
// forms still agree, and each matches the double recurrence.
TEST(SsdScan, ChunkedAndSequentialAgreeOnALongSegment) {
  const int64_t T = 300;
  const std::vector<SeqSegment> segs = {{0, T}};
  std::vector<float> x = random_floats(T * H * P, 60), dt(T * H), B = random_floats(T * G * N, 61),
                     C = random_floats(T * G * N, 62), D = random_floats(H, 63);
  const std::vector<float> raw = random_floats(T * H, 64);
  for (int64_t i = 0; i < T * H; ++i) dt[i] = 0.01f + 2.0f / (1.0f + std::exp(-raw[i]));
  const std::vector<float> A = {-0.05f, -1.0f, -4.0f, -20.0f};
  const cpu::SsdInputs in{f32({T, H, P}, x), f32({T, H}, dt), f32({H}, A), f32({T, G, N}, B), f32({T, G, N}, C),
                          f32({H}, D)};
  const std::vector<float> seq = cpu::ssd_scan_sequential_forward({H, P, G, N, 0}, in, segs).to_floats();
  const std::vector<float> chk = cpu::ssd_scan_chunked_forward({H, P, G, N, 32}, in, segs).to_floats();
  expect_close(chk, to_double(seq), kFwdRtol, kAtol, "chunked vs sequential");
  const std::vector<float> r = random_floats(T * H * P, 65);
  const cpu::SsdGrads gs = cpu::ssd_scan_sequential_backward({H, P, G, N, 0}, in, f32({T, H, P}, r), segs);
  const cpu::SsdGrads gc = cpu::ssd_scan_chunked_backward({H, P, G, N, 32}, in, f32({T, H, P}, r), segs);
  for (auto m : {&cpu::SsdGrads::dx, &cpu::SsdGrads::ddt, &cpu::SsdGrads::dA, &cpu::SsdGrads::dB, &cpu::SsdGrads::dC,
                 &cpu::SsdGrads::dD})
    expect_close((gc.*m).to_floats(), to_double((gs.*m).to_floats()), kGradRtol, kAtol, "chunked vs sequential grad");
}

}  // namespace
}  // namespace mt
