// Linear, embedding, RMSNorm, RoPE, SwiGLU, residual: forward against naive double loops,
// backward against central differences of those loops.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/float_convert.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "op_check.h"

namespace mt {
namespace {

using test::expect_close;
using test::numeric_grad;

std::vector<double> naive_linear(const std::vector<double>& x, const std::vector<double>& w, int N, int in, int out) {
  std::vector<double> y(N * out, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) y[n * out + o] += x[n * in + i] * w[o * in + i];
  return y;
}

TEST(CpuLinear, ForwardBackwardMatchNaive) {
  const int N = 5, in = 7, out = 3;
  auto xv = test::random_floats(N * in, 1), wv = test::random_floats(out * in, 2), rv = test::random_floats(N * out, 3);
  Tensor x = test::f32({N, in}, xv), w = test::f32({out, in}, wv);
  Tensor y = cpu::linear_forward(x, w, false);
  expect_close(y.to_floats(), naive_linear(test::to_double(xv), test::to_double(wv), N, in, out), 1e-6, 0, "y");

  Tensor dx = Tensor::empty({N, in}, DType::F32);
  Tensor dw = test::f32({out, in}, std::vector<float>(out * in, 0.5f));  // accumulates onto 0.5
  cpu::linear_backward(test::f32({N, out}, rv), x, w, &dx, &dw);
  auto r = test::to_double(rv);
  auto gx = numeric_grad([&](const std::vector<double>& xx) { return test::dot(naive_linear(xx, test::to_double(wv), N, in, out), r); },
                         test::to_double(xv));
  auto gw = numeric_grad([&](const std::vector<double>& ww) { return test::dot(naive_linear(test::to_double(xv), ww, N, in, out), r); },
                         test::to_double(wv));
  for (auto& g : gw) g += 0.5;
  expect_close(dx.to_floats(), gx, 1e-5, 1e-6, "dx");
  expect_close(dw.to_floats(), gw, 1e-5, 1e-6, "dw");
}

TEST(CpuLinear, Bf16WeightsRoundTheOutput) {
  const int N = 4, in = 9, out = 6;
  auto xv = test::random_floats(N * in, 4), wv = test::random_floats(out * in, 5);
  for (auto& v : xv) v = round_bf16(v);
  Tensor w = Tensor::from_floats({out, in}, wv, DType::BF16);
  auto wr = w.to_floats();
  Tensor y = cpu::linear_forward(test::f32({N, in}, xv), w, true);
  auto want = naive_linear(test::to_double(xv), test::to_double(wr), N, in, out);
  auto got = y.to_floats();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], round_bf16(got[i])) << "not a bf16 value at " << i;
    EXPECT_NEAR(got[i], want[i], std::fabs(want[i]) * 1e-2 + 1e-6) << i;
  }
}

TEST(CpuLinear, EmptyBatchAndEmptyReduction) {
  Tensor w = test::f32({3, 4}, test::random_floats(12, 6));
  Tensor y = cpu::linear_forward(Tensor::empty({0, 4}, DType::F32), w, false);
  EXPECT_EQ(y.shape(), Shape({0, 3}));
  Tensor w0 = Tensor::empty({3, 0}, DType::F32);
  Tensor y0 = cpu::linear_forward(Tensor::empty({2, 0}, DType::F32), w0, false);
  for (float v : y0.to_floats()) EXPECT_EQ(v, 0.0f);
}

TEST(CpuEmbedding, GatherAndScatterAdd) {
  const int V = 5, H = 3;
  auto tv = test::random_floats(V * H, 7);
  Tensor table = test::f32({V, H}, tv);
  Tensor ids = Tensor::empty({4}, DType::I64);
  int64_t idv[] = {2, 0, 2, 4};
  for (int i = 0; i < 4; ++i) ids.data_as<int64_t>()[i] = idv[i];
  auto out = cpu::embedding_forward(ids, table).to_floats();
  for (int i = 0; i < 4; ++i)
    for (int h = 0; h < H; ++h) EXPECT_EQ(out[i * H + h], tv[idv[i] * H + h]);
  auto dv = test::random_floats(4 * H, 8);
  Tensor dtable = Tensor::zeros({V, H}, DType::F32);
  cpu::embedding_backward(ids, test::f32({4, H}, dv), dtable, std::nullopt);
  auto g = dtable.to_floats();
  for (int h = 0; h < H; ++h) {
    EXPECT_FLOAT_EQ(g[2 * H + h], dv[0 * H + h] + dv[2 * H + h]);
    EXPECT_FLOAT_EQ(g[0 * H + h], dv[1 * H + h]);
    EXPECT_FLOAT_EQ(g[4 * H + h], dv[3 * H + h]);
    EXPECT_EQ(g[1 * H + h], 0.0f);
    EXPECT_EQ(g[3 * H + h], 0.0f);
  }
  ids.data_as<int64_t>()[1] = V;
  EXPECT_THROW(cpu::embedding_forward(ids, table), Error);
  ids.data_as<int64_t>()[1] = -1;
  EXPECT_THROW(cpu::embedding_forward(ids, table), Error);
}

// torch's nn.Embedding(padding_idx): the pad row's gradient stays exactly what it was (here a nonzero start, so
// "no contribution" and "zeroed" differ), and every other row is bit for bit the gradient without a pad index.
TEST(CpuEmbedding, PaddingIdxRowGetsNoGradient) {
  const int V = 6, H = 4, N = 9;
  Tensor ids = Tensor::empty({N}, DType::I64);
  const int64_t idv[N] = {3, 1, 3, 5, 0, 3, 1, 2, 3};  // the pad id 3 four times, first and last among them
  for (int i = 0; i < N; ++i) ids.data_as<int64_t>()[i] = idv[i];
  Tensor dout = test::f32({N, H}, test::random_floats(N * H, 21));
  const std::vector<float> g0 = test::random_floats(V * H, 22);
  Tensor plain = test::f32({V, H}, g0), padded = test::f32({V, H}, g0);
  cpu::embedding_backward(ids, dout, plain, std::nullopt);
  cpu::embedding_backward(ids, dout, padded, int64_t{3});
  const std::vector<float> p = plain.to_floats(), q = padded.to_floats();
  for (int v = 0; v < V; ++v)
    for (int h = 0; h < H; ++h) {
      if (v == 3) {
        EXPECT_EQ(q[v * H + h], g0[v * H + h]) << "pad row, column " << h;
        EXPECT_NE(p[v * H + h], g0[v * H + h]) << "without a pad index the row trains, column " << h;
      } else {
        EXPECT_EQ(q[v * H + h], p[v * H + h]) << "row " << v << ", column " << h;
      }
    }
  // A pad index no token carries changes nothing; one outside [0, V) is refused.
  Tensor unused = test::f32({V, H}, g0);
  cpu::embedding_backward(ids, dout, unused, int64_t{4});
  EXPECT_EQ(unused.to_floats(), p);
  EXPECT_THROW(cpu::embedding_backward(ids, dout, unused, int64_t{V}), Error);
  EXPECT_THROW(cpu::embedding_backward(ids, dout, unused, int64_t{-1}), Error);
}

std::vector<double> naive_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int rows, int n,
                                  double eps) {
  std::vector<double> y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
    const double rs = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) y[r * n + i] = w[i] * x[r * n + i] * rs;
  }
  return y;
}

TEST(CpuRmsNorm, ForwardBackwardMatchNaive) {
  const int rows = 6, n = 8;
  const double eps = 1e-6;
  auto xv = test::random_floats(rows * n, 9), wv = test::random_floats(n, 10), rv = test::random_floats(rows * n, 11);
  Tensor x = test::f32({2, 3, n}, xv), w = test::f32({n}, wv);
  Tensor y = cpu::rmsnorm_forward(x, w, (float)eps, false);
  EXPECT_EQ(y.shape(), x.shape());
  expect_close(y.to_floats(), naive_rmsnorm(test::to_double(xv), test::to_double(wv), rows, n, eps), 1e-6, 0, "y");
  Tensor dw = Tensor::zeros({n}, DType::F32);
  Tensor dx = cpu::rmsnorm_backward(test::f32({2, 3, n}, rv), x, w, (float)eps, dw);
  auto r = test::to_double(rv);
  auto gx = numeric_grad([&](const std::vector<double>& xx) { return test::dot(naive_rmsnorm(xx, test::to_double(wv), rows, n, eps), r); },
                         test::to_double(xv));
  auto gw = numeric_grad([&](const std::vector<double>& ww) { return test::dot(naive_rmsnorm(test::to_double(xv), ww, rows, n, eps), r); },
                         test::to_double(wv));
  expect_close(dx.to_floats(), gx, 1e-5, 1e-6, "dx");
  expect_close(dw.to_floats(), gw, 1e-5, 1e-6, "dw");
}

TEST(CpuRmsNorm, Bf16RoundsNormalisedValueThenProduct) {
  const int n = 16;
  auto xv = test::random_floats(n, 12), wv = test::random_floats(n, 13);
  for (auto& v : xv) v = round_bf16(v);
  Tensor w = Tensor::from_floats({n}, wv, DType::BF16);
  auto wr = w.to_floats();
  auto got = cpu::rmsnorm_forward(test::f32({1, n}, xv), w, 1e-6f, true).to_floats();
  float ss = 0;
  double ssd = 0;
  for (float v : xv) ssd += (double)v * v;
  ss = (float)(ssd / n);
  const float rs = 1.0f / std::sqrt(ss + 1e-6f);
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[i], round_bf16(wr[i] * round_bf16(xv[i] * rs))) << i;
}

// Naive RoPE in double: inv_freq_i = 1/theta^(2i/D), half-split rotation.
std::vector<double> naive_rope(const std::vector<double>& x, const std::vector<int64_t>& pos, int heads, int D,
                               double theta) {
  std::vector<double> y(x.size());
  const int T = (int)pos.size(), half = D / 2;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < D; ++j) {
        const int i = j % half;
        const double f = pos[t] / std::pow(theta, 2.0 * i / D);
        const double* xr = &x[(t * heads + h) * D];
        const double rot = j < half ? -xr[j + half] : xr[j - half];
        y[(t * heads + h) * D + j] = xr[j] * std::cos(f) + rot * std::sin(f);
      }
  return y;
}

Tensor positions(const std::vector<int64_t>& p) {
  Tensor t = Tensor::empty({(int64_t)p.size()}, DType::I64);
  for (size_t i = 0; i < p.size(); ++i) t.data_as<int64_t>()[i] = p[i];
  return t;
}

TEST(CpuRope, PositionZeroIsIdentity) {
  const int heads = 3, D = 8;
  auto xv = test::random_floats(2 * heads * D, 14);
  auto tab = cpu::rope_tables(positions({0, 0}), D, 10000.0, false);
  auto y = cpu::rope_forward(test::f32({2, heads, D}, xv), tab, false).to_floats();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(y[i], xv[i]);
  auto tb = cpu::rope_tables(positions({0}), D, 1e6, true);
  auto yb = cpu::rope_forward(test::f32({1, heads, D}, std::vector<float>(xv.begin(), xv.begin() + heads * D)), tb, true)
                .to_floats();
  for (int i = 0; i < heads * D; ++i) EXPECT_EQ(yb[i], round_bf16(xv[i]));
}

TEST(CpuRope, ForwardBackwardMatchNaive) {
  const int heads = 2, D = 8;
  const std::vector<int64_t> pos = {0, 1, 5, 17, 300};
  const int T = (int)pos.size();
  auto xv = test::random_floats(T * heads * D, 15), rv = test::random_floats(T * heads * D, 16);
  auto tab = cpu::rope_tables(positions(pos), D, 10000.0, false);
  Tensor x = test::f32({T, heads, D}, xv);
  expect_close(cpu::rope_forward(x, tab, false).to_floats(), naive_rope(test::to_double(xv), pos, heads, D, 1e4), 2e-5, 0,
               "rope");
  auto dx = cpu::rope_backward(test::f32({T, heads, D}, rv), tab).to_floats();
  auto gx = numeric_grad([&](const std::vector<double>& xx) { return test::dot(naive_rope(xx, pos, heads, D, 1e4), test::to_double(rv)); },
                         test::to_double(xv));
  expect_close(dx, gx, 2e-5, 1e-6, "drope");
}

TEST(CpuRope, Bf16TablesAreRoundedFp32Values) {
  const int D = 4;
  auto tab = cpu::rope_tables(positions({3}), D, 10000.0, true);
  auto c = tab.cos.to_floats(), s = tab.sin.to_floats();
  const float inv1 = 1.0f / std::pow(10000.0f, 0.5f);
  EXPECT_EQ(c[0], round_bf16(std::cos(3.0f)));
  EXPECT_EQ(c[1], round_bf16(std::cos(inv1 * 3.0f)));
  EXPECT_EQ(c[3], c[1]);
  EXPECT_EQ(s[2], round_bf16(std::sin(3.0f)));
}

TEST(CpuSwiglu, ForwardBackward) {
  const int n = 12;
  auto gv = test::random_floats(n, 17, 2.0f), uv = test::random_floats(n, 18), rv = test::random_floats(n, 19);
  auto naive = [&](const std::vector<double>& g, const std::vector<double>& u) {
    std::vector<double> a(n);
    for (int i = 0; i < n; ++i) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    return a;
  };
  Tensor g = test::f32({3, 4}, gv), u = test::f32({3, 4}, uv);
  expect_close(cpu::swiglu_forward(g, u, false).to_floats(), naive(test::to_double(gv), test::to_double(uv)), 1e-6, 0, "a");
  Tensor dg, du;
  cpu::swiglu_backward(test::f32({3, 4}, rv), g, u, dg, du);
  auto r = test::to_double(rv);
  expect_close(dg.to_floats(), numeric_grad([&](const std::vector<double>& gg) { return test::dot(naive(gg, test::to_double(uv)), r); }, test::to_double(gv)),
               1e-5, 1e-7, "dg");
  expect_close(du.to_floats(), numeric_grad([&](const std::vector<double>& uu) { return test::dot(naive(test::to_double(gv), uu), r); }, test::to_double(uv)),
               1e-5, 1e-7, "du");
  // bf16: silu rounded, then the product rounded.
  auto a = cpu::swiglu_forward(g, u, true).to_floats();
  for (int i = 0; i < n; ++i) EXPECT_EQ(a[i], round_bf16(round_bf16(gv[i] / (1.0f + std::exp(-gv[i]))) * uv[i]));
}

TEST(CpuResidual, AddRoundsInBf16) {
  Tensor a = test::f32({2}, {1.0f, 3.0f}), b = test::f32({2}, {1.0f / 512, 1.0f / 1024});
  auto y = cpu::residual_add(a, b, true).to_floats();
  EXPECT_EQ(y[0], 1.0f);  // 1 + 2^-9 rounds back to 1 in bf16
  EXPECT_EQ(y[1], 3.0f);
  auto z = cpu::residual_add(a, b, false).to_floats();
  EXPECT_EQ(z[0], 1.0f + 1.0f / 512);
}

}  // namespace
}  // namespace mt
