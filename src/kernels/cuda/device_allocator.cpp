#include "kernels/cuda/device_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"

namespace mt::cuda {

namespace {
constexpr int kMaxDevices = 64;
constexpr size_t kSmallLimit = size_t{1} << 20;  // below: 512-byte classes; above: 2 MiB classes
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;

size_t size_class(size_t n) {
  if (n == 0) n = 1;
  const size_t r = n <= kSmallLimit ? kSmallRound : kLargeRound;
  return (n + r - 1) / r * r;
}

// While more than this is cached, a request may take a cached block up to 1.25x its size (rather than leaving
// gigabytes of roomy blocks unused; roomy_slack_fraction).
constexpr size_t kRoomySlackBytes = size_t{2} << 30;

// A miss while more than this is cached (and unusable for the request) first returns the cache to the
// driver: blocks are never split, so a changing mix of sizes strands memory (reserved above allocated).
// The release synchronises the device and is followed by a storm of cudaMalloc calls, so it must be rare.
// 4 GiB by default: a single-GPU step's sizes repeat; at 2 GiB the standard workload still released the
// cache ~4 times per step (~900 cudaMalloc per step, optimizer phase 84 instead of 65 ms), at 4 GiB 44.3k
// instead of 42.2k tokens/s with the same peak (73.8 allocated / 74.2 GiB reserved; 6 and 10 GiB: no faster,
// reserved 76.4 / 78.6 GiB). A multi-GPU step's sizes do not repeat (received expert rows change with every layer and micro-batch):
// at 2 GiB an expert-parallel step released ~90 times and called cudaMalloc ~2,000 times, 25.9k tokens/s
// per GPU against 34.9k with a quarter of the device as the threshold (bench/NOTES.md), so the multi-GPU
// engines raise it (allocator_set_release_threshold). MIXTUNE_ALLOC_RELEASE_GIB overrides both. A cudaMalloc
// that fails still returns the whole cache and retries.
constexpr size_t kDefaultReleaseBytes = size_t{4} << 30;
size_t g_release_bytes[64] = {};

// The roomy slack as a fraction of the request: 0.25 (a block up to 1.25x the request). It was 1.0 (up to 2x) until
// session 37, where on one H100 (bench/RESULTS.md session 37, call K; MIXTUNE_ALLOC_ROOMY_SLACK 1 / 0.25 / 0.125)
// the Nemotron slice's peak fell from 36.39 to 31.63 GiB allocated (its tensors: 31.51) at the same tokens/s
// (89,979 / 90,231 / 90,405; cudaMalloc 465 / 470 / 470 per run), while Moonlight (58.14 GiB) and the Qwen3 standard
// workload (74.66 → 74.64) kept their peaks, tokens/s within 1.7% (53,166 / 52,558 / 52,238 and 58,798 / 58,759 /
// 58,659, falling in run order) and cudaMalloc 4,430 → 4,465 and 1,315 → 1,566 per run. MIXTUNE_ALLOC_ROOMY_SLACK
// (a number in [0.125, 1]) overrides it.
double roomy_slack_fraction() {
  static const double f = [] {
    constexpr double kDefault = 0.25;
    const char* e = std::getenv("MIXTUNE_ALLOC_ROOMY_SLACK");
    const double v = e && *e ? std::strtod(e, nullptr) : kDefault;
    return v >= 0.125 && v <= 1.0 ? v : kDefault;
  }();
  return f;
}

size_t cache_release_bytes(int device) {
  static const size_t env = [] {
    const char* e = std::getenv("MIXTUNE_ALLOC_RELEASE_GIB");
    const long gib = e && *e ? std::strtol(e, nullptr, 10) : 0;
    return gib > 0 ? static_cast<size_t>(gib) << 30 : size_t{0};
  }();
  if (env) return env;
  if (device >= 0 && device < 64 && g_release_bytes[device]) return g_release_bytes[device];
  return kDefaultReleaseBytes;
}

struct DevicePool {
  std::multimap<size_t, void*> free_blocks;     // size -> block
  size_t free_bytes = 0;                        // Σ sizes in free_blocks
  std::unordered_map<void*, size_t> in_use;     // block -> size
  AllocatorStats stats;
};

struct Allocator {
  std::mutex mutex;
  DevicePool pools[kMaxDevices];
};

// Never destroyed: Tensors freed during static destruction must still find it.
Allocator& allocator() {
  static Allocator* a = new Allocator();
  return *a;
}

DevicePool& pool(int device) {
  MT_CHECK(device >= 0 && device < kMaxDevices, "cuda device index {}", device);
  return allocator().pools[device];
}

// cudaMalloc/cudaFree act on the current device: switch for the call and switch back.
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != device) MT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    if (prev >= 0) cudaSetDevice(prev);
  }
};

void release_cached(int device, DevicePool& p) {
  DeviceGuard g(device);
  // Cached blocks may still be read by queued kernels (stream-ordered reuse): let them finish first.
  if (!p.free_blocks.empty()) cudaDeviceSynchronize();
  for (auto& [size, ptr] : p.free_blocks) {
    cudaFree(ptr);
    p.stats.reserved_bytes -= static_cast<int64_t>(size);
  }
  p.free_blocks.clear();
  p.free_bytes = 0;
}

void note_peaks(AllocatorStats& s) {
  s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, s.allocated_bytes);
  s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, s.reserved_bytes);
}

// Static registration: runs when the (whole-archive linked) CUDA library is part of the program.
struct Registrar {
  Registrar() { allocator_register(); }
} g_registrar;
}  // namespace

void* device_alloc(int device, size_t nbytes) {
  const size_t cls = size_class(nbytes);
  std::lock_guard<std::mutex> lock(allocator().mutex);
  DevicePool& p = pool(device);
  // Best fit among cached blocks, accepting at most 1/8 slack so a small request cannot pin a huge block —
  // up to 1.25x while more than kRoomySlackBytes sit cached: using a roomier cached block beats returning
  // the cache (a device sync and a storm of cudaMalloc; measured when paired expert wgrads came in: 2,210
  // cudaMalloc per training step at 1/8, none at 2x; session 37: +36 a step at 1.25x, the same peaks).
  auto it = p.free_blocks.lower_bound(cls);
  const size_t slack = p.free_bytes > kRoomySlackBytes
                           ? static_cast<size_t>(static_cast<double>(cls) * roomy_slack_fraction())
                           : cls / 8;
  if (it != p.free_blocks.end() && it->first <= cls + slack) {
    void* ptr = it->second;
    const size_t size = it->first;
    p.free_blocks.erase(it);
    p.free_bytes -= size;
    p.in_use.emplace(ptr, size);
    p.stats.allocated_bytes += static_cast<int64_t>(size);
    p.stats.cache_hits++;
    note_peaks(p.stats);
    return ptr;
  }
  void* ptr = nullptr;
  {
    DeviceGuard g(device);
    if (p.free_bytes > std::max(cache_release_bytes(device), cls)) {
      release_cached(device, p);
      p.stats.cache_releases++;
    }
    cudaError_t e = cudaMalloc(&ptr, cls);
    if (e == cudaErrorMemoryAllocation && !p.free_blocks.empty()) {
      cudaGetLastError();
      release_cached(device, p);
      e = cudaMalloc(&ptr, cls);
    }
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      fail("CUDA out of memory on cuda:{}: allocating {} bytes ({} allocated, {} reserved by mixtune)", device,
           nbytes, p.stats.allocated_bytes, p.stats.reserved_bytes);
    }
    MT_CUDA_CHECK(e);
  }
  p.in_use.emplace(ptr, cls);
  p.stats.allocated_bytes += static_cast<int64_t>(cls);
  p.stats.reserved_bytes += static_cast<int64_t>(cls);
  p.stats.cuda_malloc_calls++;
  note_peaks(p.stats);
  return ptr;
}

void allocator_set_release_threshold(int device, size_t bytes) {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  MT_CHECK(device >= 0 && device < 64, "cuda device index {}", device);
  g_release_bytes[device] = bytes;
}

void device_free(int device, void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(allocator().mutex);
  if (device < 0 || device >= kMaxDevices) return;
  DevicePool& p = allocator().pools[device];
  auto it = p.in_use.find(ptr);
  if (it == p.in_use.end()) return;  // not ours: ignore rather than corrupt the cache
  p.stats.allocated_bytes -= static_cast<int64_t>(it->second);
  p.free_blocks.emplace(it->second, ptr);
  p.free_bytes += it->second;
  p.in_use.erase(it);
}

AllocatorStats allocator_stats(int device) {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  return pool(device).stats;
}

void allocator_reset_peak(int device) {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  AllocatorStats& s = pool(device).stats;
  s.peak_allocated_bytes = s.allocated_bytes;
  s.peak_reserved_bytes = s.reserved_bytes;
}

void allocator_empty_cache(int device) {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  release_cached(device, pool(device));
}

void allocator_register() {
  DeviceAllocator a;
  a.alloc = [](int index, size_t n) { return device_alloc(index, n); };
  a.free = [](int index, void* p) { device_free(index, p); };
  register_cuda_allocator(a);
}

}  // namespace mt::cuda
