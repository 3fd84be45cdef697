// Next-token choice from a logits row, as Transformers' generate() does it: greedy argmax when
// temperature is 0, else the logits warpers in HF order — TemperatureLogitsWarper, TopKLogitsWarper,
// TopPLogitsWarper — and a draw from the softmax of what is left. The draw uses mixtune's seeded
// Rng, so a seed reproduces a run of mixtune (not of torch.multinomial).
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace mt {

struct SamplingOptions {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;        // (0, 1]; 1 = off
  int64_t top_k = 0;         // 0 = off
};

// mt::Error naming --temperature / --top-p / --top-k when a value is out of range (or not finite).
void sampling_options_check(const SamplingOptions& o);

// Index of the largest logit; equal maxima go to the lowest index (torch.argmax). NaN is an mt::Error.
int64_t sample_argmax(const float* logits, int64_t n);

// The logits after the warpers (temperature > 0): scores = logits / temperature (fp32); top-k keeps every
// score >= the k-th largest (ties at the boundary all stay, as TopKLogitsWarper); top-p sorts ascending,
// takes the fp32 softmax's cumulative sum and drops scores whose cumulative probability is <= 1 - top_p,
// always keeping the largest (TopPLogitsWarper; among equal scores the higher index is dropped first).
// Dropped entries are -inf.
std::vector<float> sampling_warp_logits(const float* logits, int64_t n, const SamplingOptions& o);

// The next token: sample_argmax when temperature == 0, else one draw (rng.uniform()) from the softmax
// of sampling_warp_logits. NaN logits are an mt::Error.
int64_t sample_token(const float* logits, int64_t n, const SamplingOptions& o, Rng& rng);

}  // namespace mt
