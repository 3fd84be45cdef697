#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

std::vector<float> rope_default_inv_freq(int64_t D, double theta) {
  MT_CHECK(D > 0 && D % 2 == 0, "rope head_dim must be even and positive, got {}", D);
  // Transformers: 1.0 / (base ** (arange(0, D, 2).float() / D)), all in fp32.
  std::vector<float> inv_freq(static_cast<size_t>(D / 2));
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < D / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(D);
    inv_freq[i] = 1.0f / std::pow(base, e);
  }
  return inv_freq;
}

std::vector<float> rope_yarn_inv_freq(int64_t D, double theta, double factor, double beta_fast, double beta_slow,
                                      int64_t original_max_positions, bool truncate) {
  MT_CHECK(D > 0 && D % 2 == 0, "rope head_dim must be even and positive, got {}", D);
  MT_CHECK(factor > 0 && beta_fast > 0 && beta_slow > 0 && original_max_positions > 0 && theta > 1,
           "yarn: factor {} beta_fast {} beta_slow {} original_max_position_embeddings {} theta {}", factor, beta_fast,
           beta_slow, original_max_positions, theta);
  // The correction range in double (Python floats), the ramp and the frequencies in fp32 (torch tensors).
  const double dim = static_cast<double>(D);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(original_max_positions) / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  const float base = static_cast<float>(theta), flow = static_cast<float>(low),
              fspan = static_cast<float>(high - low), ffactor = static_cast<float>(factor);
  std::vector<float> inv_freq(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) {
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(D));
    const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (ffactor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - flow) / fspan, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv_freq;
}

RopeTables rope_tables(const Tensor& positions, int64_t D, double theta, bool bf16) {
  return rope_tables(positions, rope_default_inv_freq(D, theta), 1.0f, bf16);
}

RopeTables rope_tables(const Tensor& positions, const std::vector<float>& inv_freq, float attention_factor,
                       bool bf16) {
  MT_CHECK(!inv_freq.empty(), "rope: no frequencies");
  MT_CHECK(positions.dtype() == DType::I64, "rope positions must be I64, got {}", positions.desc());
  const int64_t half = static_cast<int64_t>(inv_freq.size()), D = 2 * half, T = positions.numel();
  RopeTables t{Tensor::empty({T, D}, DType::F32), Tensor::empty({T, D}, DType::F32)};
  const int64_t* pos = positions.data_as<int64_t>();
  float* c = t.cos.data_as<float>();
  float* s = t.sin.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * D) >= kParallelMinWork)
  for (int64_t r = 0; r < T; ++r) {
    const float p = static_cast<float>(pos[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float f = inv_freq[i] * p;
      float cv = std::cos(f) * attention_factor, sv = std::sin(f) * attention_factor;
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

Tensor rope_interleaved_forward(const Tensor& x, const RopeTables& t, bool bf16) {
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
  auto r = [bf16](float v) { return bf16 ? round_bf16(v) : v; };
#pragma omp parallel for schedule(static) if ((T * heads * D) >= kParallelMinWork)
  for (int64_t p = 0; p < T; ++p) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = xp + (p * heads + h) * D;
      float* orow = o + (p * heads + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = xr[2 * i], x2 = xr[2 * i + 1], cv = c[p * D + i], sv = s[p * D + i];
        orow[i] = r(r(x1 * cv) - r(x2 * sv));
        orow[half + i] = r(r(x2 * cv) + r(x1 * sv));
      }
    }
  }
  return out;
}

Tensor rope_interleaved_backward(const Tensor& dy, const RopeTables& t) {
  const int64_t T = t.cos.dim(0), D = t.cos.dim(1), half = D / 2;
  check_f32_numel(dy, "rope dy", dy.numel());
  const int64_t heads = T == 0 ? 0 : dy.numel() / (T * D);
  Tensor dx = Tensor::empty(dy.shape(), DType::F32);
  const float* g = dy.data_as<float>();
  const float* c = t.cos.data_as<float>();
  const float* s = t.sin.data_as<float>();
  float* d = dx.data_as<float>();
#pragma omp parallel for schedule(static) if ((T * heads * D) >= kParallelMinWork)
  for (int64_t p = 0; p < T; ++p) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* gr = g + (p * heads + h) * D;
      float* dr = d + (p * heads + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float g1 = gr[i], g2 = gr[half + i], cv = c[p * D + i], sv = s[p * D + i];
        dr[2 * i] = g1 * cv + g2 * sv;
        dr[2 * i + 1] = g2 * cv - g1 * sv;
      }
    }
  }
  return dx;
}

}  // namespace mt::cpu
