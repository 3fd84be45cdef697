// How much a kernel boundary costs on the GPU, and how much programmatic dependent launch (PDL) takes off it.
//
// A chain of dependent kernels (each reads what the previous one wrote) is timed with CUDA events, launched
// three ways: plain stream order; with the programmatic-stream-serialization attribute and a
// `griddepcontrol.wait` at the top of the kernel (the next grid is launched while this one drains, and waits
// for it before touching memory); and the same with `griddepcontrol.launch_dependents` at the top too (the
// next grid may be scheduled as soon as every block of this one has started). The difference per kernel
// between the plain chain and the PDL chains is the boundary cost PDL hides. Sizes: one block doing nothing,
// and copies of 16 MiB (a [4096, 2048] bf16 activation: the norms' size) and 128 MiB (the expert rows).
// `pdl_wait_memset_us`: the PDL chain with a 4-byte cudaMemsetAsync before each kernel (what resetting a counter
// with a memset costs in a chain of PDL kernels).
//
//   mixtune_bench_launch_gap [--kernels N]      JSON on stdout
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "launch_gap_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

enum class Mode { plain = 0, pdl_wait = 1, pdl_wait_trigger = 2 };

__global__ void copy_kernel(const float4* __restrict__ in, float4* __restrict__ out, long long n, int mode) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (mode != 0) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (mode == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    float4 v = in[i];
    v.x += 1.0f;
    out[i] = v;
  }
}

void launch(Mode mode, int blocks, int threads, const float4* in, float4* out, long long n, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = mode == Mode::plain ? 0 : 1;
  check(cudaLaunchKernelEx(&cfg, copy_kernel, in, out, n, static_cast<int>(mode)), "cudaLaunchKernelEx");
}

// Mean time per kernel (µs) of a chain of `kernels` launches, best of 5 repetitions.
// memset: a 4-byte cudaMemsetAsync (of `flag`) before every kernel, as a counter reset would be.
double chain_us(Mode mode, int kernels, long long bytes, float4* a, float4* b, int sms, cudaStream_t s,
                int* flag = nullptr) {
  const long long n = bytes / 16;
  const int threads = 256;
  const int blocks = n == 0 ? 1 : static_cast<int>(std::min<long long>((n + threads - 1) / threads, sms * 8LL));
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    check(cudaEventRecord(e0, s), "record");
    for (int k = 0; k < kernels; ++k) {
      if (flag) check(cudaMemsetAsync(flag, 0, sizeof(int), s), "memset");
      launch(mode, blocks, threads, k % 2 ? b : a, k % 2 ? a : b, n, s);
    }
    check(cudaEventRecord(e1, s), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    if (rep > 0) best = std::min(best, 1000.0 * ms / kernels);  // the first repetition warms up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int kernels = 2000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--kernels") && i + 1 < argc) {
      kernels = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: mixtune_bench_launch_gap [--kernels N]\n");
      return 2;
    }
  }
  if (kernels < 1) kernels = 1;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  const long long max_bytes = 128LL << 20;
  float4 *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, max_bytes), "malloc");
  check(cudaMalloc(&b, max_bytes), "malloc");
  check(cudaMemset(a, 0, max_bytes), "memset");
  check(cudaMemset(b, 0, max_bytes), "memset");
  int* flag = nullptr;
  check(cudaMalloc(&flag, sizeof(int)), "malloc");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  std::printf("{\"device\": \"%s\", \"kernels\": %d, \"cases\": [", prop.name, kernels);
  const long long sizes[] = {0, 16LL << 20, 128LL << 20};
  for (int si = 0; si < 3; ++si) {
    const long long bytes = sizes[si];
    double us[3];
    for (int m = 0; m < 3; ++m)
      us[m] = chain_us(static_cast<Mode>(m), kernels, bytes, a, b, prop.multiProcessorCount, s);
    const double memset_us = chain_us(Mode::pdl_wait, kernels, bytes, a, b, prop.multiProcessorCount, s, flag);
    const double gbs = bytes > 0 ? 2.0 * bytes / (us[0] * 1e-6) / 1e9 : 0.0;
    std::printf("%s\n  {\"bytes\": %lld, \"plain_us\": %.3f, \"pdl_wait_us\": %.3f, \"pdl_wait_trigger_us\": %.3f, "
                "\"pdl_wait_memset_us\": %.3f, \"plain_gb_per_s\": %.1f}",
                si ? "," : "", bytes, us[0], us[1], us[2], memset_us, gbs);
  }
  std::printf("\n]}\n");
  cudaFree(a);
  cudaFree(b);
  cudaFree(flag);
  return 0;
}
