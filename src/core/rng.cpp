#include "core/rng.h"

#include <cmath>

namespace mt {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
constexpr double kTwoPi = 6.283185307179586476925286766559;
}  // namespace

Rng::Rng(uint64_t seed, uint64_t stream) {
  // Mix the stream into the seed through one splitmix64 round so nearby streams diverge at once.
  uint64_t x = seed;
  uint64_t k = splitmix64(x) ^ stream;
  for (uint64_t& s : s_) s = splitmix64(k);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // u1 in (0, 1] so log(u1) is finite.
  double u1 = 1.0 - uniform();
  double u2 = uniform();
  double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(kTwoPi * u2);
  has_spare_ = true;
  return r * std::cos(kTwoPi * u2);
}

void Rng::fill_uniform(float* out, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(lo + (hi - lo) * uniform());
}

void Rng::fill_normal(float* out, int64_t n, double mean, double std) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(mean + std * normal());
}

uint64_t rng_stream_of(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace mt
