// Shared by the CUDA model tests: host weights copied to GPU 0, zero gradient buffers there, a micro-batch with
// packed documents and ignored labels, and the per-gradient comparison of two models' gradients.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "../../kernels/cuda/error_report.h"
#include "kernels/cuda/device_copy.h"
#include "models/decoder_model.h"
#include "models/model_weights.h"
#include "models/spec/decoder_spec.h"

namespace mt::test {

// Every parameter of `host` uploaded unchanged (same dtype) to cuda:0.
inline ModelWeights to_device_weights(ModelWeights& host) {
  ModelWeights d = host;  // same structure; every tensor replaced below
  auto src = host.named_parameters();
  auto dst = d.named_parameters();
  for (size_t i = 0; i < src.size(); ++i) *dst[i].second = cuda::to_device(*src[i].second, 0);
  return d;
}

// F32 zeros shaped like cfg's parameters on cuda:0.
inline ModelWeights device_zeros_like(const DecoderSpec& cfg) {
  ModelWeights host = ModelWeights::zeros_like_config(cfg, DType::F32);
  return to_device_weights(host);
}

// Two rows of 96 tokens; row 1 packs three documents; every 7th label ignored.
inline Batch test_batch(const DecoderSpec& cfg) {
  const int64_t B = 2, S = 96;
  Batch b;
  b.input_ids = Tensor::empty({B, S}, DType::I64);
  b.labels = Tensor::empty({B, S}, DType::I64);
  b.position_ids = Tensor::empty({B, S}, DType::I64);
  auto* ids = b.input_ids.data_as<int64_t>();
  auto* lab = b.labels.data_as<int64_t>();
  auto* pos = b.position_ids.data_as<int64_t>();
  uint64_t s = 12345;
  for (int64_t i = 0; i < B * S; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    ids[i] = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(cfg.vocab_size));
    lab[i] = (i % 7 == 3) ? -100 : ids[i];
    const int64_t r = i / S, t = i % S;
    pos[i] = r == 0 ? t : (t < 40 ? t : (t < 70 ? t - 40 : t - 70));
  }
  return b;
}

// A tensor's elements as floats on the host, from the device or the host.
inline std::vector<float> floats_of(const Tensor& t) {
  return t.device().is_cpu() ? t.to_floats() : device_floats(t);
}

// Normalised-error limits of one gradient (cuda_test_util.h).
struct GradLimit {
  double max_norm, rel_l2;
};

// A gradient's limits against the CPU bf16 model: `base`, or for a router weight (mlp.gate.weight) 0.1 max-norm /
// 0.06 rel-L2: its gradient goes through the routing-weight dot products over H and the softmax Jacobian of bf16
// logits, the noisiest (CudaHfFixture.MqaLegacyGradientsMatchCpuBf16).
inline GradLimit router_limit(const std::string& name, GradLimit base) {
  return name.find(".mlp.gate.") != std::string::npos ? GradLimit{0.1, 0.06} : base;
}

// Every gradient of `got` against the same-named one of `want` (the same parameter table; each on the device or
// the host) within limit(index, name); MT_PRINT_ERRORS=1 prints the measured errors. `each`, when given, also
// sees every pair (extra checks or prints).
using GradLimitFn = std::function<GradLimit(size_t index, const std::string& name)>;
using GradPairFn = std::function<void(size_t index, const std::string& name, const std::vector<float>& got,
                                      const std::vector<float>& want)>;
inline void expect_gradients_near(const ModelWeights& got, const ModelWeights& want, const GradLimitFn& limit,
                                  const std::string& what = "gradient", const GradPairFn& each = {}) {
  const auto g = got.named_parameters();
  const auto w = want.named_parameters();
  ASSERT_EQ(g.size(), w.size()) << what << ": parameter count";
  for (size_t i = 0; i < w.size(); ++i) {
    const std::string& name = w[i].first;
    ASSERT_EQ(g[i].first, name) << what;
    const std::vector<float> a = floats_of(*g[i].second), b = floats_of(*w[i].second);
    const GradLimit l = limit(i, name);
    expect_norm(a, b, l.max_norm, l.rel_l2, what + " " + name);
    if (each) each(i, name, a, b);
  }
}

// The same limits for every gradient.
inline void expect_gradients_near(const ModelWeights& got, const ModelWeights& want, GradLimit l,
                                  const std::string& what = "gradient") {
  expect_gradients_near(got, want, [l](size_t, const std::string&) { return l; }, what);
}

}  // namespace mt::test
