// Does a memory-bound kernel need every SM, and what does it draw with fewer? The step runs at the H200's power
// cap (bench/NOTES.md 87: its time is its joules), and ~105 ms of it are memory-bound kernels launched over all
// 132 SMs. This probe copies a 2 GiB buffer back to back for a few seconds with the copy confined to S SMs (one
// 1,024-thread block per SM, held there by its shared-memory request; 8 loads of 16 bytes in flight per thread)
// for several S, and reports per S the bandwidth, the mean power and the energy per byte moved, from the GPU's
// energy counter. If fewer SMs keep the bandwidth at lower power, the memory-bound kernels' grids are a lever.
//
//   mixtune_bench_copy_power [--seconds S] [--gib G]      JSON on stdout
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "kernels/cuda/gpu_energy.h"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "copy_power_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kThreads = 1024;
constexpr int kInFlight = 8;

// Grid-stride copy: each thread loads kInFlight 16-byte vectors (one per stride step) before storing them.
__global__ void __launch_bounds__(kThreads) copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out,
                                                         long long n) {
  // The launch's dynamic shared memory (unused) keeps it to one block per SM.
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long base = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; base < n;
       base += stride * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const long long i = base + k * stride;
      if (i < n) v[k] = in[i];
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const long long i = base + k * stride;
      if (i < n) out[i] = v[k];
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2.0, gib = 2.0;
  for (int i = 1; i < argc; ++i) {
    if (i + 1 < argc && std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[++i]);
    else if (i + 1 < argc && std::strcmp(argv[i], "--gib") == 0) gib = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: mixtune_bench_copy_power [--seconds S] [--gib G]\n");
      return 2;
    }
  }
  if (!(seconds > 0 && seconds < 600 && gib > 0 && gib < 64)) {
    std::fprintf(stderr, "copy_power_bench: --seconds must be in (0, 600), --gib in (0, 64)\n");
    return 2;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int sms = prop.multiProcessorCount;
  const size_t bytes = static_cast<size_t>(gib * (1ull << 30)) / 16 * 16;
  const long long n = static_cast<long long>(bytes / 16);
  uint4 *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc");
  check(cudaMalloc(&b, bytes), "cudaMalloc");
  check(cudaMemset(a, 1, bytes), "cudaMemset");
  const int smem = static_cast<int>(prop.sharedMemPerMultiprocessor / 2 + 1024);  // > half: one block per SM
  check(cudaFuncSetAttribute(copy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attribute");
  cudaStream_t st;
  check(cudaStreamCreate(&st), "cudaStreamCreate");

  // The idle GPU's power first: what every row's watts include.
  double idle_w = -1.0;
  {
    const std::optional<double> j0 = mt::cuda::gpu_energy_joules(0);
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds / 2) {
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::optional<double> j1 = mt::cuda::gpu_energy_joules(0);
    if (j0 && j1) idle_w = (*j1 - *j0) / el;
  }
  std::vector<int> counts = {sms, sms * 3 / 4, sms / 2, sms / 3, sms / 4};
  std::printf("{\n  \"device\": \"%s\", \"sms\": %d, \"bytes_per_copy\": %zu, \"seconds\": %.1f, "
              "\"idle_watts\": %.1f,\n  \"rows\": [\n",
              prop.name, sms, bytes, seconds, idle_w);
  for (size_t r = 0; r < counts.size(); ++r) {
    const int grid = counts[r];
    auto launch = [&] { copy_kernel<<<grid, kThreads, smem, st>>>(a, b, n); };
    for (int i = 0; i < 3; ++i) launch();
    check(cudaStreamSynchronize(st), "warm-up");
    const std::optional<double> j0 = mt::cuda::gpu_energy_joules(0);
    const auto t0 = std::chrono::steady_clock::now();
    long long calls = 0;
    double elapsed = 0;
    while (elapsed < seconds) {
      for (int i = 0; i < 5; ++i) launch();
      calls += 5;
      check(cudaStreamSynchronize(st), "copy");
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const std::optional<double> j1 = mt::cuda::gpu_energy_joules(0);
    const double moved = 2.0 * static_cast<double>(bytes) * static_cast<double>(calls);  // read + write
    const double joules = j0 && j1 ? *j1 - *j0 : -1.0;
    std::printf("    {\"sms_used\": %d, \"tb_per_s\": %.3f, \"watts\": %.1f, \"pj_per_byte\": %.2f}%s\n", grid,
                moved / elapsed * 1e-12, joules >= 0 ? joules / elapsed : -1.0,
                joules >= 0 ? joules / moved * 1e12 : -1.0, r + 1 < counts.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
  cudaFree(a);
  cudaFree(b);
  return 0;
}
