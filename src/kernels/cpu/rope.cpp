#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

RopeTables rope_tables(const Tensor& positions, int64_t D, double theta, bool bf16) {
  MT_CHECK(D > 0 && D % 2 == 0, "rope head_dim must be even and positive, got {}", D);
  MT_CHECK(positions.dtype() == DType::I64, "rope positions must be I64, got {}", positions.desc());
  const int64_t T = positions.numel(), half = D / 2;
  // Transformers: 1.0 / (base ** (arange(0, D, 2).float() / D)), all in fp32.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(D);
    inv_freq[i] = 1.0f / std::pow(base, e);
  }
  RopeTables t{Tensor::empty({T, D}, DType::F32), Tensor::empty({T, D}, DType::F32)};
  const int64_t* pos = positions.data_as<int64_t>();
  float* c = t.cos.data_as<float>();
  float* s = t.sin.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * D) >= kParallelMinWork)
  for (int64_t r = 0; r < T; ++r) {
    const float p = static_cast<float>(pos[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float f = inv_freq[i] * p;
      float cv = std::cos(f), sv = std::sin(f);
      if (bf16) cv = round_bf16(cv), sv = round_bf16(sv);
      c[r * D + i] = c[r * D + half + i] = cv;
      s[r * D + i] = s[r * D + half + i] = sv;
    }
  }
  return t;
}

Tensor rope_forward(const Tensor& x, const RopeTables& t, bool bf16) {
  const int64_t T = t.cos.dim(0), D = t.cos.dim(1), half = D / 2;
  check_f32_numel(x, "rope input", x.numel());
  MT_CHECK(T > 0 ? x.numel() % (T * D) == 0 : x.numel() == 0, "rope input {} for {} positions of dim {}", x.desc(),
           T, D);
  const int64_t heads = T == 0 ? 0 : x.numel() / (T * D);
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  const float* xp = x.data_as<float>();
  const float* c = t.cos.data_as<float>();
  const float* s = t.sin.data_as<float>();
  float* o = out.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * heads * D) >= kParallelMinWork)
  for (int64_t r = 0; r < T; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = xp + (r * heads + h) * D;
      float* orow = o + (r * heads + h) * D;
      for (int64_t j = 0; j < D; ++j) {
        const float rot = j < half ? -xr[j + half] : xr[j - half];
        if (bf16)
          orow[j] = round_bf16(round_bf16(xr[j] * c[r * D + j]) + round_bf16(rot * s[r * D + j]));
        else
          orow[j] = xr[j] * c[r * D + j] + rot * s[r * D + j];
      }
    }
  }
  return out;
}

Tensor rope_backward(const Tensor& dy, const RopeTables& t) {
  const int64_t T = t.cos.dim(0), D = t.cos.dim(1), half = D / 2;
  check_f32_numel(dy, "rope dy", dy.numel());
  const int64_t heads = T == 0 ? 0 : dy.numel() / (T * D);
  Tensor dx = Tensor::empty(dy.shape(), DType::F32);
  const float* g = dy.data_as<float>();
  const float* c = t.cos.data_as<float>();
  const float* s = t.sin.data_as<float>();
  float* d = dx.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * heads * D) >= kParallelMinWork)
  for (int64_t r = 0; r < T; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* gr = g + (r * heads + h) * D;
      float* dr = d + (r * heads + h) * D;
      // x_j feeds out_j (·cos_j) and, through rotate_half, out_{j+D/2} (+sin) or out_{j-D/2} (-sin).
      for (int64_t j = 0; j < half; ++j) dr[j] = gr[j] * c[r * D + j] + gr[j + half] * s[r * D + j + half];
      for (int64_t j = half; j < D; ++j) dr[j] = gr[j] * c[r * D + j] - gr[j - half] * s[r * D + j - half];
    }
  }
  return dx;
}

}  // namespace mt::cpu
