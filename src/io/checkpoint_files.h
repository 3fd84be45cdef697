// The safetensors files of a Hugging Face checkpoint directory: one model.safetensors, or
// shards listed by model.safetensors.index.json (hf-numerics.md §8.2). Reading validates the
// index against the shards; writing shards like save_pretrained and prints the index the
// way Python's json.dumps(indent=2, sort_keys=True) does.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "io/safetensors_shared.h"

namespace mt {

class CheckpointFiles {
 public:
  // Uses model.safetensors.index.json when present, else model.safetensors.
  static CheckpointFiles open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<std::string>& names() const { return names_; }  // index order, or file offset order
  bool has(const std::string& name) const { return shard_index_.count(name) != 0; }
  Tensor tensor(const std::string& name) const;
  const SafetensorsInfo& info(const std::string& name) const;
  const std::string& shard_of(const std::string& name) const;             // file name, no directory
  const std::vector<std::string>& shard_files() const { return shard_files_; }  // sorted
  const nlohmann::json& index_metadata() const { return index_metadata_; }  // {} without an index

 private:
  size_t shard_position(const std::string& name) const;
  std::string dir_;
  std::vector<std::string> shard_files_;
  std::vector<SafetensorsFile> shards_;  // parallel to shard_files_
  std::vector<std::string> names_;
  std::unordered_map<std::string, size_t> shard_index_;
  nlohmann::json index_metadata_ = nlohmann::json::object();
};

struct CheckpointWriteOptions {
  int64_t max_shard_bytes = 50'000'000'000;  // save_pretrained's default "50GB"
  // Reuse a source checkpoint's layout: tensor name -> shard file name. Every written tensor
  // needs an entry (extra entries are ignored); the index is always written.
  std::optional<std::map<std::string, std::string>> shard_of = std::nullopt;
  // The index's "total_parameters": Transformers writes num_parameters(), which leaves buffers out (DeepSeek-V3's
  // e_score_correction_bias), while "total_size" counts every byte written. < 0: every tensor's elements.
  int64_t total_parameters = -1;
};

// Writes `tensors` (in state-dict order) into `dir` as save_pretrained does, then removes
// model*.safetensors files and the index left from an earlier save that this one did not
// write (other files are left alone). Returns the file names written, index last.
std::vector<std::string> checkpoint_write_tensors(const std::string& dir,
                                                  const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                  const CheckpointWriteOptions& options = {});

// The same files written by several processes (io/safetensors_shared.h): the lead creates every shard
// (header, full size) and the index with checkpoint_shared_create; then each process writes the rows it
// holds with checkpoint_shared_write. Every process passes the same names, dtypes, shapes and options.
// Once all parts are written: byte for byte what checkpoint_write_tensors writes.
std::vector<std::string> checkpoint_shared_create(const std::string& dir,
                                                  const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                  const CheckpointWriteOptions& options = {});
void checkpoint_shared_write(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                             const CheckpointWriteOptions& options, const RowsOf& rows_of);

// "5GB" -> 5e9, "2MiB" -> 2097152, "1000" -> 1000: units B, KB/MB/GB/TB (powers of 10),
// KiB/MiB/GiB/TiB (powers of 2), case-insensitive. mt::Error names a bad value.
int64_t parse_size_bytes(const std::string& s);

}  // namespace mt
