// Seeded, reproducible random numbers for parameter init and tests: splitmix64 seeding a
// xoshiro256** generator, uniform and Box-Muller normal sampling.
// NOT bit-compatible with torch.manual_seed / torch.normal_: mixtune only promises that the same
// (seed, stream) gives the same numbers on every run and every machine with an IEEE libm.
#pragma once
#include <cstdint>
#include <string_view>

namespace mt {

class Rng {
 public:
  // Different `stream`s of one seed are independent sequences (e.g. one per parameter name),
  // so the result does not depend on the order in which tensors are initialised.
  explicit Rng(uint64_t seed, uint64_t stream = 0);

  uint64_t next_u64();
  double uniform();  // [0, 1), 53 random bits
  double normal();   // N(0, 1), Box-Muller (the second value of each pair is kept for the next call)

  void fill_uniform(float* out, int64_t n, double lo, double hi);
  void fill_normal(float* out, int64_t n, double mean, double std);

 private:
  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// A stable 64-bit stream id for a name (FNV-1a), for Rng(seed, rng_stream_of(name)).
uint64_t rng_stream_of(std::string_view name);

}  // namespace mt
