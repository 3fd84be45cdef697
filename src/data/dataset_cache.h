// Tokenized-dataset cache (internal to Dataset::load): one binary file per (data file, tokenizer,
// options), written atomically (temp file + rename). A cache file that fails any check is ignored
// and rebuilt, never trusted.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace mt {

// Key over the data file's bytes, a fingerprint of the tokenizer and every option that changes the result.
uint64_t dataset_cache_key(const DatasetOptions& options, const Tokenizer* tokenizer, int64_t vocab_size);
std::string dataset_cache_path(const DatasetOptions& options, uint64_t key);
// False when the file is absent or does not check out (wrong key, truncated, ids out of range...).
bool dataset_cache_read(const std::string& path, uint64_t key, int64_t vocab_size, int64_t seq_len,
                        std::vector<Example>& examples, DatasetStats& stats);
void dataset_cache_write(const std::string& path, uint64_t key, const std::vector<Example>& examples,
                         const DatasetStats& stats);

}  // namespace mt
