#include "kernels/cpu/aux_loss.h"

#include "core/error.h"
#include "core/float_convert.h"
#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/router.h"

namespace mt::cpu {

double aux_loss_forward(const std::vector<Tensor>& logits, int64_t top_k, bool bf16, AuxLossSaved* saved) {
  if (logits.empty()) return 0.0;
  const int64_t E = logits[0].dim(1);
  MT_CHECK(top_k >= 1 && top_k <= E, "aux loss top-k {} with {} experts", top_k, E);
  std::vector<double> cnt(static_cast<size_t>(E), 0.0), psum(static_cast<size_t>(E), 0.0);
  int64_t rows = 0;
  for (const Tensor& l : logits) {
    const int64_t T = l.dim(0);
    check_f32(l, "aux loss logits", {T, E});
    Tensor p = Tensor::empty({T, E}, DType::F32);
    float* pp = p.data_as<float>();
    softmax_rows_f32(l.data_as<float>(), T, E, pp, bf16);
    std::vector<int32_t> idx(static_cast<size_t>(top_k));
    for (int64_t t = 0; t < T; ++t) {
      topk_row(pp + t * E, E, top_k, idx.data());
      for (int64_t s = 0; s < top_k; ++s) cnt[idx[s]] += 1.0;
      for (int64_t e = 0; e < E; ++e) psum[e] += pp[t * E + e];
    }
    rows += T;
  }
  if (rows == 0) return 0.0;
  double aux = 0.0;
  std::vector<double> frac(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    frac[e] = cnt[e] / static_cast<double>(rows);
    double P = psum[e] / static_cast<double>(rows);
    if (bf16) P = round_bf16(static_cast<float>(P));
    aux += frac[e] * P;
  }
  if (saved) {
    saved->fraction = frac;
    saved->rows = rows;
  }
  return aux * static_cast<double>(E);
}

void aux_loss_backward(double daux, const std::vector<Tensor>& logits, const AuxLossSaved& saved, bool bf16,
                       std::vector<Tensor>& dlogits) {
  MT_CHECK(dlogits.size() == logits.size(), "aux loss backward: {} grads for {} layers", dlogits.size(),
           logits.size());
  if (logits.empty() || saved.rows == 0) return;
  const int64_t E = logits[0].dim(1);
  MT_CHECK(static_cast<int64_t>(saved.fraction.size()) == E, "aux loss backward without a saved forward");
  // d(aux)/d(p[t, e]) = E · f_e / rows, then through the softmax.
  std::vector<float> dp(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    dp[e] = static_cast<float>(daux * static_cast<double>(E) * saved.fraction[e] / static_cast<double>(saved.rows));
  for (size_t l = 0; l < logits.size(); ++l) {
    const int64_t T = logits[l].dim(0);
    check_f32(dlogits[l], "aux loss dlogits", {T, E});
    Tensor p = Tensor::empty({T, E}, DType::F32);
    float* pp = p.data_as<float>();
    softmax_rows_f32(logits[l].data_as<float>(), T, E, pp, bf16);
    float* g = dlogits[l].data_as<float>();
#pragma omp parallel for schedule(static) if ((T * E) >= kParallelMinWork)
    for (int64_t t = 0; t < T; ++t) {
      double dot = 0.0;
      for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(pp[t * E + e]) * dp[e];
      for (int64_t e = 0; e < E; ++e) g[t * E + e] += pp[t * E + e] * (dp[e] - static_cast<float>(dot));
    }
  }
}

}  // namespace mt::cpu
