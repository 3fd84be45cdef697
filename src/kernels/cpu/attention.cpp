#include "kernels/cpu/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

// NOTE: the (batch, head) loop is serial and each matmul is one cblas_sgemm (threaded by OpenBLAS);
// row-wise softmax work is OpenMP-parallel. Calling the pthread OpenBLAS from inside an OpenMP
// region would oversubscribe the cores and contend on its thread pool.

namespace mt::cpu {

namespace {

int64_t value_dim(const AttentionShape& s) { return s.v_dim > 0 ? s.v_dim : s.head_dim; }

void check_shapes(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc) {
  MT_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0, "attention heads {} / kv_heads {}", s.heads,
           s.kv_heads);
  check_f32(q, "attention q", {s.batch, s.seq, s.heads, s.head_dim});
  check_f32(k, "attention k", {s.batch, s.seq, s.kv_heads, s.head_dim});
  check_f32(v, "attention v", {s.batch, s.seq, s.kv_heads, value_dim(s)});
  if (doc.defined())
    MT_CHECK(doc.dtype() == DType::I32 && doc.shape() == Shape({s.batch, s.seq}), "attention doc ids {}",
             doc.desc());
}

// Key j is visible to query i: causal, inside the window, in the same packed document.
inline bool visible(int64_t i, int64_t j, int64_t window, const int32_t* doc) {
  return j <= i && (window <= 0 || j > i - window) && (!doc || doc[j] == doc[i]);
}

// Fills P[i, j] (row stride S) with softmax probabilities for query rows of one (b, h), masked
// entries 0. `P` holds scale·Q·Kᵀ on entry. If lse_out is set it is written, else lse_in is used.
// sink: the head's sink logit joins each row's softmax (nullptr: none).
void softmax_rows(int64_t S, float* P, const int32_t* doc, int64_t window, const float* sink, float* lse_out,
                  const float* lse_in) {
#pragma omp parallel for schedule(static) if ((S * S) >= kParallelMinWork)
  for (int64_t i = 0; i < S; ++i) {
    float* row = P + i * S;
    float lse;
    if (lse_out) {
      float m = sink ? *sink : -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= i; ++j)
        if (visible(i, j, window, doc)) m = std::max(m, row[j]);
      double sum = sink ? std::exp(static_cast<double>(*sink - m)) : 0.0;
      for (int64_t j = 0; j <= i; ++j)
        if (visible(i, j, window, doc)) sum += std::exp(static_cast<double>(row[j] - m));
      lse = m + static_cast<float>(std::log(sum));
      lse_out[i] = lse;
    } else {
      lse = lse_in[i];
    }
    for (int64_t j = 0; j < S; ++j) row[j] = visible(i, j, window, doc) ? std::exp(row[j] - lse) : 0.0f;
  }
}

// Transformers' eager bf16 softmax on rows of bf16 scores (`P` holds bf16(bf16(Q·Kᵀ)·scale)): c = bf16(x − max)
// over the visible keys and the sink, softmax of c in fp32, rounded to bf16; the sink's column dropped.
void eager_bf16_probs(int64_t S, float* P, const int32_t* doc, int64_t window, const float* sink) {
#pragma omp parallel for schedule(static) if ((S * S) >= kParallelMinWork)
  for (int64_t i = 0; i < S; ++i) {
    float* row = P + i * S;
    float m = sink ? *sink : -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j <= i; ++j)
      if (visible(i, j, window, doc)) m = std::max(m, row[j]);
    double sum = sink ? std::exp(static_cast<double>(round_bf16(*sink - m))) : 0.0;
    for (int64_t j = 0; j <= i; ++j)
      if (visible(i, j, window, doc)) sum += std::exp(static_cast<double>(round_bf16(row[j] - m)));
    const float fs = static_cast<float>(sum);
    for (int64_t j = 0; j < S; ++j)
      row[j] = visible(i, j, window, doc) ? round_bf16(std::exp(round_bf16(row[j] - m)) / fs) : 0.0f;
  }
}

float scale_of(const AttentionShape& s) {
  return s.scale > 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
}

std::vector<float> sinks_f32(const AttentionShape& s, const Tensor& sinks) {
  if (!sinks.defined()) return {};
  MT_CHECK(sinks.ndim() == 1 && sinks.dim(0) == s.heads, "attention sinks {} for {} heads", sinks.desc(), s.heads);
  return param_f32(sinks).to_floats();
}

}  // namespace

Tensor attention_forward(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& doc, bool bf16, Tensor& lse, const Tensor& sinks) {
  check_shapes(s, q, k, v, doc);
  const int64_t B = s.batch, S = s.seq, Hq = s.heads, Hk = s.kv_heads, D = s.head_dim, Dv = value_dim(s),
                group = Hq / Hk;
  const float scale = scale_of(s);
  const std::vector<float> sink = sinks_f32(s, sinks);
  const bool eager = bf16 && s.eager_bf16;
  Tensor out = Tensor::empty({B, S, Hq, Dv}, DType::F32);
  lse = Tensor::empty({B, Hq, S}, DType::F32);
  std::vector<float> P(static_cast<size_t>(S * S));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* dp = doc.defined() ? doc.data_as<int32_t>() + b * S : nullptr;
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / group;
      const float* qp = q.data_as<float>() + (b * S * Hq + h) * D;
      const float* kp = k.data_as<float>() + (b * S * Hk + g) * D;
      const float* vp = v.data_as<float>() + (b * S * Hk + g) * Dv;
      float* op = out.data_as<float>() + (b * S * Hq + h) * Dv;
      const float* sk = sink.empty() ? nullptr : &sink[static_cast<size_t>(h)];
      gemm_nt(S, S, D, scale, qp, Hq * D, kp, Hk * D, 0.0f, P.data(), S);
      // lse from the fp32 scores (what the backward recomputes P from).
      std::vector<float> scores(eager ? static_cast<size_t>(S * S) : 0);
      softmax_rows(S, P.data(), dp, s.window, sk, lse.data_as<float>() + (b * Hq + h) * S, nullptr);
      if (eager) {
        gemm_nt(S, S, D, 1.0f, qp, Hq * D, kp, Hk * D, 0.0f, scores.data(), S);
        for (float& x : scores) x = round_bf16(round_bf16(x) * scale);
        eager_bf16_probs(S, scores.data(), dp, s.window, sk);
        P.swap(scores);
      } else if (bf16) {
        round_bf16_inplace(P.data(), S * S);
      }
      gemm_nn(S, Dv, S, 1.0f, P.data(), S, vp, Hk * Dv, 0.0f, op, Hq * Dv);
    }
  }
  if (bf16) round_bf16_inplace(out.data_as<float>(), out.numel());
  return out;
}

void attention_backward(const AttentionShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& doc, const Tensor& lse, bool bf16, Tensor& dq, Tensor& dk,
                        Tensor& dv, const Tensor& sinks, Tensor* dsinks) {
  check_shapes(s, q, k, v, doc);
  const int64_t B = s.batch, S = s.seq, Hq = s.heads, Hk = s.kv_heads, D = s.head_dim, Dv = value_dim(s),
                group = Hq / Hk;
  check_f32(dout, "attention dout", {B, S, Hq, Dv});
  check_f32(lse, "attention lse", {B, Hq, S});
  const float scale = scale_of(s);
  const std::vector<float> sink = sinks_f32(s, sinks);
  MT_CHECK(!sink.empty() || dsinks == nullptr, "attention backward: a sinks gradient without sinks");
  if (dsinks) check_f32(*dsinks, "attention dsinks", {Hq});
  dq = Tensor::empty(q.shape(), DType::F32);
  dk = Tensor::zeros(k.shape(), DType::F32);
  dv = Tensor::zeros(v.shape(), DType::F32);
  std::vector<float> P(static_cast<size_t>(S * S)), dP(static_cast<size_t>(S * S));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* dp = doc.defined() ? doc.data_as<int32_t>() + b * S : nullptr;
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / group;
      const float* qp = q.data_as<float>() + (b * S * Hq + h) * D;
      const float* kp = k.data_as<float>() + (b * S * Hk + g) * D;
      const float* vp = v.data_as<float>() + (b * S * Hk + g) * Dv;
      const float* gp = dout.data_as<float>() + (b * S * Hq + h) * Dv;
      float* dqp = dq.data_as<float>() + (b * S * Hq + h) * D;
      float* dkp = dk.data_as<float>() + (b * S * Hk + g) * D;
      float* dvp = dv.data_as<float>() + (b * S * Hk + g) * Dv;
      const float* lp = lse.data_as<float>() + (b * Hq + h) * S;
      gemm_nt(S, S, D, scale, qp, Hq * D, kp, Hk * D, 0.0f, P.data(), S);
      softmax_rows(S, P.data(), dp, s.window, nullptr, nullptr, lp);
      // dV += Pᵀ·dO with the P the forward multiplied (bf16-rounded in bf16 mode).
      if (bf16) {
        std::vector<float> Pr(P);
        round_bf16_inplace(Pr.data(), S * S);
        gemm_tn(S, Dv, S, 1.0f, Pr.data(), S, gp, Hq * Dv, 1.0f, dvp, Hk * Dv);
      } else {
        gemm_tn(S, Dv, S, 1.0f, P.data(), S, gp, Hq * Dv, 1.0f, dvp, Hk * Dv);
      }
      gemm_nt(S, S, Dv, 1.0f, gp, Hq * Dv, vp, Hk * Dv, 0.0f, dP.data(), S);
      // Softmax backward: dS = P ⊙ (dP − Σ_j P·dP), in place into dP. The sink's column has no value vector
      // (dP_sink = 0): d(sink) = −Σ_i p_sink,i · Σ_j P_ij·dP_ij.
      double dsink = 0.0;
#pragma omp parallel for schedule(static) if ((S * S) >= kParallelMinWork) reduction(+ : dsink)
      for (int64_t i = 0; i < S; ++i) {
        const float* pr = P.data() + i * S;
        float* gr = dP.data() + i * S;
        double dot = 0.0;
        for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(pr[j]) * gr[j];
        const float d = static_cast<float>(dot);
        for (int64_t j = 0; j < S; ++j) gr[j] = pr[j] * (gr[j] - d);
        if (!sink.empty()) dsink -= std::exp(static_cast<double>(sink[static_cast<size_t>(h)]) - lp[i]) * dot;
      }
      if (dsinks) dsinks->data_as<float>()[h] += static_cast<float>(dsink);
      gemm_nn(S, D, S, scale, dP.data(), S, kp, Hk * D, 0.0f, dqp, Hq * D);
      gemm_tn(S, D, S, scale, dP.data(), S, qp, Hq * D, 1.0f, dkp, Hk * D);
    }
  }
}

}  // namespace mt::cpu
