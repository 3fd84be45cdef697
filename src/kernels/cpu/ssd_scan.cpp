#include "kernels/cpu/ssd_scan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

namespace {

struct Dims {
  int64_t T, H, P, G, N, per_group;
};

Dims check_inputs(const SsdShape& s, const SsdInputs& in, const std::vector<SeqSegment>& segs) {
  MT_CHECK(s.heads >= 1 && s.head_dim >= 1 && s.groups >= 1 && s.state >= 1 && s.heads % s.groups == 0,
           "ssd scan: {} heads x {} in {} groups, state {}", s.heads, s.head_dim, s.groups, s.state);
  MT_CHECK(in.x.defined() && in.x.ndim() == 3, "ssd scan x {}", in.x.defined() ? in.x.desc() : "none");
  const Dims d{in.x.dim(0), s.heads, s.head_dim, s.groups, s.state, s.heads / s.groups};
  check_f32(in.x, "ssd scan x", {d.T, d.H, d.P});
  check_f32(in.dt, "ssd scan dt", {d.T, d.H});
  check_f32(in.A, "ssd scan A", {d.H});
  check_f32(in.B, "ssd scan B", {d.T, d.G, d.N});
  check_f32(in.C, "ssd scan C", {d.T, d.G, d.N});
  check_f32(in.D, "ssd scan D", {d.H});
  check_segments(segs, d.T);
  return d;
}

// One head's view of the inputs over one segment.
struct HeadView {
  const Dims& d;
  const SeqSegment& seg;
  int64_t h;
  const float* x;   // [T, H, P]
  const float* dt;  // [T, H]
  const float* B;   // [T, G, N]
  const float* C;
  float A, D;

  int64_t g() const { return h / d.per_group; }
  const float* x_at(int64_t i) const { return x + ((seg.start + i) * d.H + h) * d.P; }
  float dt_at(int64_t i) const { return dt[(seg.start + i) * d.H + h]; }
  const float* B_at(int64_t i) const { return B + ((seg.start + i) * d.G + g()) * d.N; }
  const float* C_at(int64_t i) const { return C + ((seg.start + i) * d.G + g()) * d.N; }
};

HeadView head_view(const Dims& d, const SsdInputs& in, const SeqSegment& seg, int64_t h) {
  return {d,
          seg,
          h,
          in.x.data_as<float>(),
          in.dt.data_as<float>(),
          in.B.data_as<float>(),
          in.C.data_as<float>(),
          in.A.data_as<float>()[h],
          in.D.data_as<float>()[h]};
}

SsdGrads zero_grads(const Dims& d) {
  SsdGrads g;
  g.dx = Tensor::zeros({d.T, d.H, d.P}, DType::F32);
  g.ddt = Tensor::zeros({d.T, d.H}, DType::F32);
  g.dA = Tensor::zeros({d.H}, DType::F32);
  g.dB = Tensor::zeros({d.T, d.G, d.N}, DType::F32);
  g.dC = Tensor::zeros({d.T, d.G, d.N}, DType::F32);
  g.dD = Tensor::zeros({d.H}, DType::F32);
  return g;
}

// Per (segment, group) work items: a group's heads share B and C, so their dB / dC are summed by one thread.
struct Item {
  const SeqSegment* seg;
  int64_t g;
};
std::vector<Item> group_items(const Dims& d, const std::vector<SeqSegment>& segs) {
  std::vector<Item> items;
  for (const SeqSegment& s : segs)
    for (int64_t g = 0; g < d.G; ++g) items.push_back({&s, g});
  return items;
}

// The pieces of the gradient one head contributes (through xd = x·dt and a = A·dt): dx, ddt, dA (returned).
double finish_head_grads(const HeadView& v, const std::vector<float>& dxd, const std::vector<double>& da, SsdGrads& g) {
  const Dims& d = v.d;
  float* dxp = g.dx.data_as<float>();
  float* ddtp = g.ddt.data_as<float>();
  double dA = 0.0;
  for (int64_t i = 0; i < v.seg.length; ++i) {
    const int64_t t = v.seg.start + i;
    const float* x = v.x_at(i);
    const float dt = v.dt_at(i);
    double ddt = da[static_cast<size_t>(i)] * v.A;
    for (int64_t p = 0; p < d.P; ++p) {
      const float gxd = dxd[static_cast<size_t>(i * d.P + p)];
      dxp[(t * d.H + v.h) * d.P + p] += gxd * dt;
      ddt += static_cast<double>(gxd) * x[p];
    }
    ddtp[t * d.H + v.h] = static_cast<float>(ddt);
    dA += da[static_cast<size_t>(i)] * dt;
  }
  return dA;
}

// dD and the skip's share of dx: y += D·x.
double skip_grads(const HeadView& v, const float* dy, SsdGrads& g) {
  const Dims& d = v.d;
  float* dxp = g.dx.data_as<float>();
  double dD = 0.0;
  for (int64_t i = 0; i < v.seg.length; ++i) {
    const int64_t off = ((v.seg.start + i) * d.H + v.h) * d.P;
    for (int64_t p = 0; p < d.P; ++p) {
      dD += static_cast<double>(dy[off + p]) * v.x_at(i)[p];
      dxp[off + p] += v.D * dy[off + p];
    }
  }
  return dD;
}

// ---------------------------------------------------------------------------------------------------------------
// Sequential form

// Runs the recurrence of one head over its segment; y (optional) receives its outputs, states (optional) S_t for
// every t ([L, P, N]).
void sequential_head(const HeadView& v, float* y, std::vector<float>* states) {
  const Dims& d = v.d;
  const int64_t P = d.P, N = d.N;
  std::vector<float> S(static_cast<size_t>(P * N), 0.0f);
  if (states) states->assign(static_cast<size_t>(v.seg.length * P * N), 0.0f);
  for (int64_t i = 0; i < v.seg.length; ++i) {
    const float dt = v.dt_at(i), decay = std::exp(v.A * dt);
    const float* x = v.x_at(i);
    const float* B = v.B_at(i);
    const float* C = v.C_at(i);
    for (int64_t p = 0; p < P; ++p) {
      const float xd = x[p] * dt;
      float acc = 0.0f;
      for (int64_t n = 0; n < N; ++n) {
        float& s = S[static_cast<size_t>(p * N + n)];
        s = decay * s + xd * B[n];
        acc += C[n] * s;
      }
      if (y) y[((v.seg.start + i) * d.H + v.h) * P + p] = acc + v.D * x[p];
    }
    if (states) std::copy(S.begin(), S.end(), states->begin() + i * P * N);
  }
}

}  // namespace

Tensor ssd_scan_sequential_forward(const SsdShape& s, const SsdInputs& in, const std::vector<SeqSegment>& segs) {
  const Dims d = check_inputs(s, in, segs);
  Tensor y = Tensor::empty({d.T, d.H, d.P}, DType::F32);
  float* yp = y.data_as<float>();
  const int64_t items = static_cast<int64_t>(segs.size()) * d.H;
#pragma omp parallel for schedule(dynamic, 1) if ((d.T * d.H * d.P * d.N) >= kParallelMinWork)
  for (int64_t k = 0; k < items; ++k)
    sequential_head(head_view(d, in, segs[static_cast<size_t>(k / d.H)], k % d.H), yp, nullptr);
  return y;
}

SsdGrads ssd_scan_sequential_backward(const SsdShape& s, const SsdInputs& in, const Tensor& dy,
                                      const std::vector<SeqSegment>& segs) {
  const Dims d = check_inputs(s, in, segs);
  check_f32(dy, "ssd scan dy", {d.T, d.H, d.P});
  SsdGrads g = zero_grads(d);
  const std::vector<Item> items = group_items(d, segs);
  const float* dyp = dy.data_as<float>();
  std::vector<double> dA(static_cast<size_t>(segs.size() * d.H)), dD(dA.size());
  const int64_t P = d.P, N = d.N;
#pragma omp parallel for schedule(dynamic, 1) if ((d.T * d.H * d.P * d.N) >= kParallelMinWork)
  for (size_t k = 0; k < items.size(); ++k) {
    const Item& it = items[k];
    const int64_t L = it.seg->length;
    for (int64_t h = it.g * d.per_group; h < (it.g + 1) * d.per_group; ++h) {
      const HeadView v = head_view(d, in, *it.seg, h);
      std::vector<float> states;
      sequential_head(v, nullptr, &states);
      std::vector<float> dS(static_cast<size_t>(P * N), 0.0f), dxd(static_cast<size_t>(L * P), 0.0f);
      std::vector<double> da(static_cast<size_t>(L), 0.0);
      for (int64_t i = L - 1; i >= 0; --i) {
        const int64_t t = it.seg->start + i;
        const float dt = v.dt_at(i), decay = std::exp(v.A * dt);
        const float* x = v.x_at(i);
        const float* B = v.B_at(i);
        const float* C = v.C_at(i);
        const float* gy = dyp + (t * d.H + h) * P;
        const float* St = states.data() + i * P * N;
        const float* Sprev = i > 0 ? states.data() + (i - 1) * P * N : nullptr;
        float* dB = g.dB.data_as<float>() + (t * d.G + it.g) * N;
        float* dC = g.dC.data_as<float>() + (t * d.G + it.g) * N;
        double ddecay = 0.0;
        for (int64_t p = 0; p < P; ++p) {
          const float xd = x[p] * dt;
          float gxd = 0.0f;
          for (int64_t n = 0; n < N; ++n) {
            float& ds = dS[static_cast<size_t>(p * N + n)];
            dC[n] += gy[p] * St[p * N + n];
            ds += gy[p] * C[n];  // y_t = S_t · C_t
            gxd += ds * B[n];
            dB[n] += ds * xd;
            if (Sprev) ddecay += static_cast<double>(ds) * Sprev[p * N + n];
            ds *= decay;  // into S_{t−1}
          }
          dxd[static_cast<size_t>(i * P + p)] = gxd;
        }
        da[static_cast<size_t>(i)] = ddecay * decay;
      }
      const size_t slot = static_cast<size_t>((it.seg - segs.data()) * d.H + h);
      dA[slot] = finish_head_grads(v, dxd, da, g);
      dD[slot] = skip_grads(v, dyp, g);
    }
  }
  for (int64_t h = 0; h < d.H; ++h) {
    double a = 0, dd = 0;
    for (size_t sg = 0; sg < segs.size(); ++sg) a += dA[sg * d.H + h], dd += dD[sg * d.H + h];
    g.dA.data_as<float>()[h] = static_cast<float>(a);
    g.dD.data_as<float>()[h] = static_cast<float>(dd);
  }
  return g;
}

// ---------------------------------------------------------------------------------------------------------------
// Chunked form

namespace {

// One head's chunked forward over its segment, with what the backward re-reads.
struct ChunkedHead {
  int64_t L = 0, Q = 0, nc = 0;
  std::vector<float> xd;     // [L, P] x·dt
  std::vector<float> a;      // [L] A·dt
  std::vector<float> cs;     // [L] cumulative sum of a inside each chunk
  std::vector<float> st;     // [nc, P, N] each chunk's own end state (from zero)
  std::vector<float> decay;  // [nc, nc] exp(segsum of the chunk totals) between the states (row z: states into z)
  std::vector<float> s_in;   // [nc, P, N] the state entering each chunk

  int64_t len(int64_t z) const { return std::min(Q, L - z * Q); }
};

// segsum of a[0..n) as torch's masked cumsum computes it: out[l·n + s] = Σ_{i=s+1}^{l} a[i] (double, rounded), s ≤ l.
void segsum(const float* a, int64_t n, float* out) {
  for (int64_t s = 0; s < n; ++s) {
    double acc = 0.0;
    for (int64_t l = s; l < n; ++l) {
      if (l > s) acc += a[l];
      out[l * n + s] = static_cast<float>(acc);
    }
  }
}

// The intra-chunk matrices of chunk z: Lm = exp(segsum(a)) and G = C·Bᵀ over its rows, lower triangle (s ≤ l).
void chunk_matrices(const HeadView& v, const ChunkedHead& c, int64_t z, std::vector<float>& Lm, std::vector<float>& G) {
  const int64_t Q = c.Q, n = c.len(z), l0 = z * Q, N = v.d.N;
  Lm.assign(static_cast<size_t>(n * n), 0.0f);
  G.assign(static_cast<size_t>(n * n), 0.0f);
  segsum(c.a.data() + l0, n, Lm.data());
  for (int64_t l = 0; l < n; ++l)
    for (int64_t s = 0; s <= l; ++s) {
      float& e = Lm[static_cast<size_t>(l * n + s)];
      e = std::exp(e);
      const float* Cl = v.C_at(l0 + l);
      const float* Bs = v.B_at(l0 + s);
      float acc = 0.0f;
      for (int64_t k = 0; k < N; ++k) acc += Cl[k] * Bs[k];
      G[static_cast<size_t>(l * n + s)] = acc;
    }
}

// Forward of one head; y (when given) receives Y_diag + Y_off + D·x, final (when given, [P, N]) the state after the
// segment: the last row of the states matrix, Σ_{k=1..nc} exp(segsum)[nc, k] · st_{k−1}.
ChunkedHead chunked_head(const HeadView& v, int64_t Q, float* y, float* final = nullptr) {
  const Dims& d = v.d;
  const int64_t P = d.P, N = d.N;
  ChunkedHead c;
  c.L = v.seg.length;
  c.Q = Q;
  c.nc = (c.L + Q - 1) / Q;
  c.xd.resize(static_cast<size_t>(c.L * P));
  c.a.resize(static_cast<size_t>(c.L));
  c.cs.resize(static_cast<size_t>(c.L));
  for (int64_t i = 0; i < c.L; ++i) {
    const float dt = v.dt_at(i);
    for (int64_t p = 0; p < P; ++p) c.xd[static_cast<size_t>(i * P + p)] = v.x_at(i)[p] * dt;
    c.a[static_cast<size_t>(i)] = v.A * dt;
  }
  c.st.assign(static_cast<size_t>(c.nc * P * N), 0.0f);
  std::vector<float> Lm, G;
  for (int64_t z = 0; z < c.nc; ++z) {
    const int64_t l0 = z * Q, n = c.len(z);
    double acc = 0.0;
    for (int64_t l = 0; l < n; ++l) c.cs[static_cast<size_t>(l0 + l)] = static_cast<float>(acc += c.a[l0 + l]);
    const float last = c.cs[static_cast<size_t>(l0 + n - 1)];
    if (y) {  // Y_diag = (G ⊙ Lm) · xd
      chunk_matrices(v, c, z, Lm, G);
      for (int64_t l = 0; l < n; ++l) {
        float* yo = y + ((v.seg.start + l0 + l) * d.H + v.h) * P;
        for (int64_t p = 0; p < P; ++p) {
          float acc2 = 0.0f;
          for (int64_t s = 0; s <= l; ++s)
            acc2 += G[static_cast<size_t>(l * n + s)] * Lm[static_cast<size_t>(l * n + s)] *
                    c.xd[static_cast<size_t>((l0 + s) * P + p)];
          yo[p] = acc2;
        }
      }
    }
    // The chunk's end state from zero: Σ_l (B_l · exp(last − cs_l)) ⊗ xd_l.
    float* st = c.st.data() + z * P * N;
    for (int64_t l = 0; l < n; ++l) {
      const float ds = std::exp(last - c.cs[static_cast<size_t>(l0 + l)]);
      const float* B = v.B_at(l0 + l);
      for (int64_t p = 0; p < P; ++p) {
        const float xd = c.xd[static_cast<size_t>((l0 + l) * P + p)];
        for (int64_t k = 0; k < N; ++k) st[p * N + k] += (B[k] * ds) * xd;
      }
    }
  }
  // States into each chunk: new_states = exp(segsum([0, totals])) · [0, st_0, .., st_{nc−1}], rows 0..nc−1.
  std::vector<float> tot(static_cast<size_t>(c.nc + 1), 0.0f), seg(static_cast<size_t>((c.nc + 1) * (c.nc + 1)));
  for (int64_t z = 0; z < c.nc; ++z) tot[static_cast<size_t>(z + 1)] = c.cs[static_cast<size_t>(z * Q + c.len(z) - 1)];
  segsum(tot.data(), c.nc + 1, seg.data());
  c.decay.assign(static_cast<size_t>(c.nc * c.nc), 0.0f);
  c.s_in.assign(static_cast<size_t>(c.nc * P * N), 0.0f);
  for (int64_t z = 0; z < c.nc; ++z) {
    float* s_in = c.s_in.data() + z * P * N;
    for (int64_t k = 1; k <= z; ++k) {  // k = 0 is the zero initial state
      const float K = std::exp(seg[static_cast<size_t>(z * (c.nc + 1) + k)]);
      c.decay[static_cast<size_t>(z * c.nc + k)] = K;
      const float* st = c.st.data() + (k - 1) * P * N;
      for (int64_t e = 0; e < P * N; ++e) s_in[e] += K * st[e];
    }
  }
  if (final) {
    std::fill(final, final + P * N, 0.0f);
    for (int64_t k = 1; k <= c.nc; ++k) {
      const float K = std::exp(seg[static_cast<size_t>(c.nc * (c.nc + 1) + k)]);
      const float* st = c.st.data() + (k - 1) * P * N;
      for (int64_t e = 0; e < P * N; ++e) final[e] += K * st[e];
    }
  }
  if (!y) return c;
  // Y_off = (C · S_in) · exp(cs), then the D skip.
  for (int64_t z = 0; z < c.nc; ++z) {
    const int64_t l0 = z * Q, n = c.len(z);
    const float* s_in = c.s_in.data() + z * P * N;
    for (int64_t l = 0; l < n; ++l) {
      const float e = std::exp(c.cs[static_cast<size_t>(l0 + l)]);
      const float* C = v.C_at(l0 + l);
      const float* x = v.x_at(l0 + l);
      float* yo = y + ((v.seg.start + l0 + l) * d.H + v.h) * P;
      for (int64_t p = 0; p < P; ++p) {
        float acc = 0.0f;
        for (int64_t k = 0; k < N; ++k) acc += C[k] * s_in[p * N + k];
        yo[p] = (yo[p] + acc * e) + v.D * x[p];
      }
    }
  }
  return c;
}

}  // namespace

Tensor ssd_scan_chunked_forward(const SsdShape& s, const SsdInputs& in, const std::vector<SeqSegment>& segs,
                                Tensor* final_state) {
  const Dims d = check_inputs(s, in, segs);
  MT_CHECK(s.chunk >= 1, "ssd scan: chunk {}", s.chunk);
  MT_CHECK(!final_state || segs.size() == 1, "ssd scan: a final state for {} segments (one only)", segs.size());
  Tensor y = Tensor::empty({d.T, d.H, d.P}, DType::F32);
  float* yp = y.data_as<float>();
  float* fp = nullptr;
  if (final_state) {
    *final_state = Tensor::empty({d.H, d.P, d.N}, DType::F32);
    fp = final_state->data_as<float>();
  }
  const int64_t items = static_cast<int64_t>(segs.size()) * d.H;
#pragma omp parallel for schedule(dynamic, 1) if ((d.T * d.H * d.P * d.N) >= kParallelMinWork)
  for (int64_t k = 0; k < items; ++k)
    chunked_head(head_view(d, in, segs[static_cast<size_t>(k / d.H)], k % d.H), s.chunk, yp,
                 fp ? fp + (k % d.H) * d.P * d.N : nullptr);
  return y;
}

SsdGrads ssd_scan_chunked_backward(const SsdShape& s, const SsdInputs& in, const Tensor& dy,
                                   const std::vector<SeqSegment>& segs) {
  const Dims d = check_inputs(s, in, segs);
  MT_CHECK(s.chunk >= 1, "ssd scan: chunk {}", s.chunk);
  check_f32(dy, "ssd scan dy", {d.T, d.H, d.P});
  SsdGrads g = zero_grads(d);
  const std::vector<Item> items = group_items(d, segs);
  const float* dyp = dy.data_as<float>();
  std::vector<double> dA(static_cast<size_t>(segs.size() * d.H)), dD(dA.size());
  const int64_t P = d.P, N = d.N, Q = s.chunk;
#pragma omp parallel for schedule(dynamic, 1) if ((d.T * d.H * d.P * d.N) >= kParallelMinWork)
  for (size_t it_k = 0; it_k < items.size(); ++it_k) {
    const Item& it = items[it_k];
    for (int64_t h = it.g * d.per_group; h < (it.g + 1) * d.per_group; ++h) {
      const HeadView v = head_view(d, in, *it.seg, h);
      const ChunkedHead c = chunked_head(v, Q, nullptr);
      const int64_t L = c.L, nc = c.nc;
      auto dy_at = [&](int64_t i) { return dyp + ((it.seg->start + i) * d.H + h) * P; };
      auto dB_at = [&](int64_t i) { return g.dB.data_as<float>() + ((it.seg->start + i) * d.G + it.g) * N; };
      auto dC_at = [&](int64_t i) { return g.dC.data_as<float>() + ((it.seg->start + i) * d.G + it.g) * N; };
      std::vector<float> dxd(static_cast<size_t>(L * P), 0.0f);
      std::vector<double> dcs(static_cast<size_t>(L), 0.0), da(static_cast<size_t>(L), 0.0);
      std::vector<float> ds_in(static_cast<size_t>(nc * P * N), 0.0f);

      // Y_off = (C · S_in) · exp(cs).
      for (int64_t z = 0; z < nc; ++z) {
        const float* s_in = c.s_in.data() + z * P * N;
        float* gs = ds_in.data() + z * P * N;
        for (int64_t l = z * Q; l < z * Q + c.len(z); ++l) {
          const float e = std::exp(c.cs[static_cast<size_t>(l)]);
          const float* C = v.C_at(l);
          const float* gy = dy_at(l);
          float* dC = dC_at(l);
          double de = 0.0;
          for (int64_t p = 0; p < P; ++p) {
            float cs_p = 0.0f;
            for (int64_t k = 0; k < N; ++k) cs_p += C[k] * s_in[p * N + k];
            de += static_cast<double>(gy[p]) * cs_p;
            const float gcs = gy[p] * e;
            for (int64_t k = 0; k < N; ++k) {
              dC[k] += gcs * s_in[p * N + k];
              gs[p * N + k] += gcs * C[k];
            }
          }
          dcs[static_cast<size_t>(l)] += de * e;
        }
      }

      // S_in[z] = Σ_{1 ≤ k ≤ z} K[z][k] · st_{k−1},  K[z][k] = exp(Σ_{i=k+1}^{z} tot_i), tot_i = chunk i−1's total.
      std::vector<float> dst(static_cast<size_t>(nc * P * N), 0.0f);
      std::vector<double> dtot(static_cast<size_t>(nc + 1), 0.0);
      for (int64_t z = 1; z < nc; ++z) {
        const float* gs = ds_in.data() + z * P * N;
        std::vector<double> dseg(static_cast<size_t>(z + 1), 0.0);  // d/d segsum[z][k]
        for (int64_t k = 1; k <= z; ++k) {
          const float K = c.decay[static_cast<size_t>(z * nc + k)];
          const float* st = c.st.data() + (k - 1) * P * N;
          float* gst = dst.data() + (k - 1) * P * N;
          double dK = 0.0;
          for (int64_t e = 0; e < P * N; ++e) {
            gst[e] += K * gs[e];
            dK += static_cast<double>(gs[e]) * st[e];
          }
          dseg[static_cast<size_t>(k)] = dK * K;
        }
        // segsum[z][k] = Σ_{i=k+1}^{z} tot_i: tot_i gets the terms k < i.
        double run = 0.0;
        for (int64_t i = 1; i <= z; ++i) {
          run += dseg[static_cast<size_t>(i - 1)];
          dtot[static_cast<size_t>(i)] += run;
        }
      }
      for (int64_t z = 0; z < nc; ++z)  // tot_{z+1} = cs at chunk z's last token
        dcs[static_cast<size_t>(z * Q + c.len(z) - 1)] += dtot[static_cast<size_t>(z + 1)];

      std::vector<float> Lm, G;
      for (int64_t z = 0; z < nc; ++z) {
        const int64_t l0 = z * Q, n = c.len(z);
        const float last = c.cs[static_cast<size_t>(l0 + n - 1)];
        // The chunk's end state st[p][k] = Σ_l B_l[k] · exp(last − cs_l) · xd_l[p].
        const float* gst = dst.data() + z * P * N;
        for (int64_t l = 0; l < n; ++l) {
          const float ds = std::exp(last - c.cs[static_cast<size_t>(l0 + l)]);
          const float* B = v.B_at(l0 + l);
          float* dB = dB_at(l0 + l);
          double dds = 0.0;
          for (int64_t k = 0; k < N; ++k) {
            float q = 0.0f;  // Σ_p dst[p][k] · xd[p]
            for (int64_t p = 0; p < P; ++p) q += gst[p * N + k] * c.xd[static_cast<size_t>((l0 + l) * P + p)];
            dB[k] += ds * q;
            dds += static_cast<double>(B[k]) * q;
          }
          for (int64_t p = 0; p < P; ++p) {
            float acc = 0.0f;
            for (int64_t k = 0; k < N; ++k) acc += gst[p * N + k] * B[k];
            dxd[static_cast<size_t>((l0 + l) * P + p)] += ds * acc;
          }
          const double dlog = dds * ds;
          dcs[static_cast<size_t>(l0 + n - 1)] += dlog;
          dcs[static_cast<size_t>(l0 + l)] -= dlog;
        }
        // Y_diag[l] = Σ_{s ≤ l} G[l][s] · Lm[l][s] · xd[s].
        chunk_matrices(v, c, z, Lm, G);
        for (int64_t l = 0; l < n; ++l) {
          const float* gy = dy_at(l0 + l);
          const float* Cl = v.C_at(l0 + l);
          float* dCl = dC_at(l0 + l);
          double run = 0.0;  // Σ_{s < i} dsegsum[l][s], for i = s + 1 .. l
          for (int64_t s2 = 0; s2 <= l; ++s2) {
            const float* xds = c.xd.data() + (l0 + s2) * P;
            float dM = 0.0f;
            for (int64_t p = 0; p < P; ++p) dM += gy[p] * xds[p];
            const size_t e = static_cast<size_t>(l * n + s2);
            const float M = G[e] * Lm[e];
            for (int64_t p = 0; p < P; ++p) dxd[static_cast<size_t>((l0 + s2) * P + p)] += M * gy[p];
            const float dG = dM * Lm[e];
            const float* Bs = v.B_at(l0 + s2);
            float* dBs = dB_at(l0 + s2);
            for (int64_t k = 0; k < N; ++k) {
              dCl[k] += dG * Bs[k];
              dBs[k] += dG * Cl[k];
            }
            // segsum[l][s2] = Σ_{i=s2+1}^{l} a_i: its gradient reaches a_i for s2 < i ≤ l.
            if (s2 > 0) da[static_cast<size_t>(l0 + s2)] += run;
            run += static_cast<double>(dM) * G[e] * Lm[e];  // d/d segsum = dLm · Lm, dLm = dM · G
          }
        }
        // cs[l] = Σ_{i ≤ l} a_i inside the chunk.
        double suffix = 0.0;
        for (int64_t l = n - 1; l >= 0; --l) {
          suffix += dcs[static_cast<size_t>(l0 + l)];
          da[static_cast<size_t>(l0 + l)] += suffix;
        }
      }
      const size_t slot = static_cast<size_t>((it.seg - segs.data()) * d.H + h);
      dA[slot] = finish_head_grads(v, dxd, da, g);
      dD[slot] = skip_grads(v, dyp, g);
    }
  }
  for (int64_t h = 0; h < d.H; ++h) {
    double a = 0, dd = 0;
    for (size_t sg = 0; sg < segs.size(); ++sg) a += dA[sg * d.H + h], dd += dD[sg * d.H + h];
    g.dA.data_as<float>()[h] = static_cast<float>(a);
    g.dD.data_as<float>()[h] = static_cast<float>(dd);
  }
  return g;
}

}  // namespace mt::cpu
