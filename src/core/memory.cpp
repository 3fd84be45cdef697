#include "core/memory.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"

namespace mt {

namespace {
constexpr int kMaxCuda = 64;
struct Counters {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> mapped{0};
};
Counters g_cpu;
Counters g_cuda[kMaxCuda];

Counters& counters(Device d) {
  if (d.is_cpu()) return g_cpu;
  MT_CHECK(d.index >= 0 && d.index < kMaxCuda, "cuda index {}", d.index);
  return g_cuda[d.index];
}
}  // namespace

MemoryStats memory_stats(Device d) {
  Counters& c = counters(d);
  return {c.current.load(), c.peak.load(), c.mapped.load()};
}

void memory_reset_peak(Device d) {
  Counters& c = counters(d);
  c.peak.store(c.current.load());
}

void memory_note_alloc(Device d, size_t bytes) {
  Counters& c = counters(d);
  int64_t now = c.current.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t prev = c.peak.load();
  while (now > prev && !c.peak.compare_exchange_weak(prev, now)) {
  }
}

void memory_note_free(Device d, size_t bytes) { counters(d).current.fetch_sub(static_cast<int64_t>(bytes)); }

void memory_note_map(Device d, int64_t delta) { counters(d).mapped.fetch_add(delta); }

}  // namespace mt
