// Memory accounting per device: bytes currently allocated and the peak since the last reset.
// Every owned allocation goes through here; memory-mapped checkpoint bytes are counted apart.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace mt {

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t mapped_bytes = 0;  // file-backed (mmap) bytes, not allocated
};

MemoryStats memory_stats(Device d);
void memory_reset_peak(Device d);
void memory_note_alloc(Device d, size_t bytes);
void memory_note_free(Device d, size_t bytes);
void memory_note_map(Device d, int64_t delta_bytes);

}  // namespace mt
