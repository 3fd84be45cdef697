// Shared by the CUDA model tests: host weights copied to GPU 0, and zero gradient buffers there.
#pragma once
#include "kernels/cuda/device_copy.h"
#include "models/spec/decoder_spec.h"
#include "models/model_weights.h"

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

}  // namespace mt::test
