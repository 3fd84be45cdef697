// Pre-tokenized JSONL: one {"input_ids": [...], "labels": [...], "position_ids": [...]} object per
// line; labels and position_ids are optional. Used by `mixtune score` and the input_ids/labels dataset.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct TokenRecord {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;        // same length as input_ids; -100 = ignored
  std::vector<int64_t> position_ids;  // empty = 0..n-1
  int64_t line = 0;                   // 1-based line in the file
};

// Reads and validates every line: ids in [0, vocab_size), labels in [0, vocab_size) or -100, equal
// lengths, non-empty. Errors name the file, the line and the field. Blank lines are skipped.
// Without labels, labels = input_ids (the model shifts them).
std::vector<TokenRecord> token_jsonl_read(const std::string& path, int64_t vocab_size);

}  // namespace mt
