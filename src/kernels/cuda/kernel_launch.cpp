#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

std::atomic<int> g_override{-1};  // -1: the default
std::atomic<int> g_default{-1};   // -1: not decided yet

bool device_supports_pdl() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major >= 9;
}

}  // namespace

bool pdl_enabled() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1 && device_supports_pdl();
  int d = g_default.load(std::memory_order_relaxed);
  if (d < 0) {
    const char* env = std::getenv("MIXTUNE_PDL");
    d = (env && std::strcmp(env, "0") == 0) ? 0 : (device_supports_pdl() ? 1 : 0);
    g_default.store(d, std::memory_order_relaxed);
  }
  return d == 1;
}

void pdl_set_enabled(int on_off_or_default) {
  g_override.store(on_off_or_default < 0 ? -1 : (on_off_or_default ? 1 : 0), std::memory_order_relaxed);
}

}  // namespace mt::cuda
