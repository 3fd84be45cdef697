// The kernel benches' sustained mode: an op run back to back for some seconds, its rate and its energy per FLOP
// from the GPU's energy counter (kernels/cuda/gpu_energy.h). Under the H200's power cap both differ from a short
// timing at the boost clock (bench/NOTES.md 47).
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_energy.h"

namespace mt_bench {

struct Sustained {
  double tflops = 0, pj_per_flop = 0;
  bool energy = false;
};
// f (flops per call, queued on `stream`) run back to back for `seconds`, a sync every 10 calls; device 0's energy.
template <typename F>
inline Sustained sustained(double seconds, double flops, cudaStream_t stream, F&& f) {
  Sustained r;
  if (seconds <= 0) return r;
  for (int i = 0; i < 3; ++i) f();
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::optional<double> j0 = mt::cuda::gpu_energy_joules(0);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t calls = 0;
  double elapsed = 0;
  while (elapsed < seconds) {
    for (int i = 0; i < 10; ++i) f();
    calls += 10;
    MT_CUDA_CHECK(cudaStreamSynchronize(stream));
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const std::optional<double> j1 = mt::cuda::gpu_energy_joules(0);
  r.tflops = flops * static_cast<double>(calls) / elapsed * 1e-12;
  if (j0 && j1 && *j1 > *j0) {
    r.energy = true;
    r.pj_per_flop = (*j1 - *j0) / (flops * static_cast<double>(calls)) * 1e12;
  }
  return r;
}

// The sustained fields of a JSON row (none without --energy-seconds), their names prefixed.
inline std::string sustained_json(const Sustained& s, const std::string& prefix) {
  if (s.tflops <= 0) return "";
  char buf[160];
  if (s.energy)
    std::snprintf(buf, sizeof buf, ", \"%ssustained_tflops\": %.1f, \"%spj_per_flop\": %.3f", prefix.c_str(), s.tflops,
                  prefix.c_str(), s.pj_per_flop);
  else
    std::snprintf(buf, sizeof buf, ", \"%ssustained_tflops\": %.1f", prefix.c_str(), s.tflops);
  return buf;
}

}  // namespace mt_bench
