// safetensors files (hf-numerics.md §8.3): a memory-mapped, zero-copy, fully validating
// reader and a writer that produces the same bytes as the Python `safetensors` library.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mt {

struct SafetensorsInfo {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the whole header against the file size; throws
  // mt::Error naming the file and the tensor/field on any inconsistency. NOTE: like any
  // mmap reader, a file truncated by another process while mapped faults (SIGBUS) on access.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::string>& names() const { return names_; }  // in data-offset order
  bool has(const std::string& name) const { return infos_.count(name) != 0; }
  const SafetensorsInfo& info(const std::string& name) const;
  // A CPU tensor borrowing the mapped bytes (zero copy; the mapping lives as long as any
  // tensor or copy of this object). NOTE: the data section starts at 8 + header length,
  // which a foreign producer need not pad to 8, so a tensor may be mis-aligned for its
  // dtype. Files from our writer and from Python `safetensors` are element-aligned.
  // Callers that must accept any file should copy (clone) or read bytes with memcpy.
  Tensor tensor(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::shared_ptr<Storage> data_;  // the data section, borrowed from the mapping
  std::vector<std::string> names_;
  std::unordered_map<std::string, SafetensorsInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// Where safetensors_write puts everything: `prefix` (the 8-byte header length and the padded header),
// then the tensors' data; offset[name] is a tensor's first byte in the file. Checks what
// safetensors_write checks (`path` names the file in errors).
struct SafetensorsLayout {
  std::string prefix;
  std::vector<std::string> order;  // data order
  std::unordered_map<std::string, uint64_t> offset;
  uint64_t file_bytes = 0;
};
SafetensorsLayout safetensors_layout(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                                     const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes `tensors` to `path` atomically (temp file in the same directory, fsync, rename).
// Byte-identical to Python safetensors.torch.save_file: header `__metadata__` first, then
// tensors by dtype descending and name ascending, data in the same order. Metadata keys are
// written sorted (Rust writes its HashMap in arbitrary order; one key, as HF uses, is exact).
// Empty `metadata` omits `__metadata__`. Tensors must be CPU; names unique, valid UTF-8.
void safetensors_write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace mt
