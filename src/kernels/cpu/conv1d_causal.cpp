#include "kernels/cpu/conv1d_causal.h"

#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

namespace {
struct ConvDims {
  int64_t T, C, K;
};

ConvDims conv_dims(const Tensor& x, const Tensor& w, const std::vector<SeqSegment>& segs) {
  MT_CHECK(x.ndim() == 2 && w.ndim() == 3 && w.dim(1) == 1 && w.dim(0) == x.dim(1) && w.dim(2) >= 1,
           "conv1d: input {} weight {}", x.desc(), w.desc());
  const ConvDims d{x.dim(0), x.dim(1), w.dim(2)};
  check_f32(x, "conv1d input", {d.T, d.C});
  check_param(w, "conv1d weight", {d.C, 1, d.K});
  check_segments(segs, d.T);
  return d;
}
}  // namespace

Tensor conv1d_causal_forward(const Tensor& x, const Tensor& w, const Tensor& b, const std::vector<SeqSegment>& segs,
                             bool bf16) {
  const ConvDims d = conv_dims(x, w, segs);
  const int64_t C = d.C, K = d.K;
  if (b.defined()) check_param(b, "conv1d bias", {C});
  const Tensor wf = param_f32(w), bf = b.defined() ? param_f32(b) : Tensor();
  const float* xp = x.data_as<float>();
  const float* wp = wf.data_as<float>();
  const float* bp = bf.defined() ? bf.data_as<float>() : nullptr;
  Tensor y = Tensor::empty({d.T, C}, DType::F32);
  float* yp = y.data_as<float>();
  for (const SeqSegment& s : segs) {
#pragma omp parallel for schedule(static) if ((s.length * C * K) >= kParallelMinWork)
    for (int64_t i = 0; i < s.length; ++i) {
      const int64_t t = s.start + i;
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = i - (K - 1) + j;  // inside the segment
          if (src >= 0) acc += wp[c * K + j] * xp[(s.start + src) * C + c];
        }
        if (bp) acc += bp[c];
        yp[t * C + c] = bf16 ? round_bf16(acc) : acc;
      }
    }
  }
  return y;
}

Tensor conv1d_causal_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const std::vector<SeqSegment>& segs,
                              Tensor* dw, Tensor* db) {
  const ConvDims d = conv_dims(x, w, segs);
  const int64_t C = d.C, K = d.K;
  check_f32(dy, "conv1d dy", {d.T, C});
  const bool want_dw = dw && dw->defined(), want_db = db && db->defined();
  if (want_dw) check_f32(*dw, "conv1d dw", {C, 1, K});
  if (want_db) check_f32(*db, "conv1d db", {C});
  const Tensor wf = param_f32(w);
  const float* xp = x.data_as<float>();
  const float* wp = wf.data_as<float>();
  const float* gp = dy.data_as<float>();
  Tensor dx = Tensor::empty({d.T, C}, DType::F32);
  float* dxp = dx.data_as<float>();
  // dx[t − (K−1) + j] += w[j] · dy[t]: gathered per input position, taps in a fixed order.
  for (const SeqSegment& s : segs) {
#pragma omp parallel for schedule(static) if ((s.length * C * K) >= kParallelMinWork)
    for (int64_t i = 0; i < s.length; ++i)
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t out = i + (K - 1) - j;  // the output position reading x[i] through tap j
          if (out < s.length) acc += wp[c * K + j] * gp[(s.start + out) * C + c];
        }
        dxp[(s.start + i) * C + c] = acc;
      }
  }
  // dw[c, j] = Σ_t dy[t, c] · x[t − (K−1) + j, c]; db[c] = Σ_t dy[t, c]: per channel in token order, in double.
  if (want_dw || want_db) {
    float* dwp = want_dw ? dw->data_as<float>() : nullptr;
    float* dbp = want_db ? db->data_as<float>() : nullptr;
#pragma omp parallel for schedule(static) if ((d.T * C * K) >= kParallelMinWork)
    for (int64_t c = 0; c < C; ++c) {
      std::vector<double> tap(static_cast<size_t>(K), 0.0);
      double bias = 0.0;
      for (const SeqSegment& s : segs)
        for (int64_t i = 0; i < s.length; ++i) {
          const double g = gp[(s.start + i) * C + c];
          bias += g;
          for (int64_t j = 0; j < K; ++j) {
            const int64_t src = i - (K - 1) + j;
            if (src >= 0) tap[static_cast<size_t>(j)] += g * xp[(s.start + src) * C + c];
          }
        }
      if (dwp)
        for (int64_t j = 0; j < K; ++j) dwp[c * K + j] += static_cast<float>(tap[static_cast<size_t>(j)]);
      if (dbp) dbp[c] += static_cast<float>(bias);
    }
  }
  return dx;
}

}  // namespace mt::cpu
