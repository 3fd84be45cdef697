// Training data: JSONL files in four formats, tokenized once (cached by data + tokenizer hash), then
// served as micro-batches by a seeded, resumable loader that can pack several documents per row.
//
// Line formats (detected per line by its keys):
//   {"messages": [{"role": ..., "content": ...}, ...]}   OpenAI chat; rendered with the model's chat template
//     (+ "tools", "chat_template_kwargs" optional)       (a Qwen3 or GPT-OSS layout, chat_format.h); loss only
//                                                        on assistant turns (answer-only)
//   {"prompt": "...", "completion": "..."}               loss only on the completion (+ EOS)
//   {"text": "..."}                                      continued pre-training: loss on every token (+ EOS)
//   {"input_ids": [...], "labels": [...]}                pre-tokenized; labels optional (= input_ids)
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt {

class Tokenizer;

// One document. labels are aligned with input_ids (NOT shifted; the model shifts): -100 = no loss.
struct Example {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;
};

struct DatasetOptions {
  std::string path;                  // JSONL file
  int64_t seq_len = 4096;            // longest document kept (a row's length when packing)
  std::string truncation = "right";  // right: keep the first seq_len tokens | drop: skip longer documents
  bool skip_bad_lines = false;       // false: a malformed line is an error (file:line: field: problem)
  std::string cache_dir;             // tokenized cache; empty = no cache
  bool enable_thinking = false;      // chat template: render without <think> in the generation prompt
  // The model's chat template text (chat_template_from_model_dir); "" = the built-in Qwen3 template.
  std::string chat_template;
  // strftime_now's clock for chat templates that print the date (GPT-OSS): seconds since the epoch,
  // formatted in UTC; unset = the local time while rendering, as Transformers (a cache keeps the date
  // of the day it was built: the key does not hold the day, so a resumed run reads the same tokens).
  std::optional<int64_t> chat_now;
};

struct DatasetStats {
  int64_t lines = 0, examples = 0, skipped_bad_lines = 0, truncated = 0, dropped_too_long = 0;
  int64_t tokens = 0, trained_tokens = 0;
  bool from_cache = false;
};

class Dataset {
 public:
  // Reads, validates and tokenizes `options.path` (or reads the cache keyed by the hashes of the data file,
  // the tokenizer files and the options). `tokenizer` may be null only for pre-tokenized files.
  static Dataset load(const DatasetOptions& options, const Tokenizer* tokenizer, int64_t vocab_size);
  const std::vector<Example>& examples() const { return examples_; }
  const DatasetStats& stats() const { return stats_; }

 private:
  std::vector<Example> examples_;
  DatasetStats stats_;
};

// A micro-batch: [B, S] tensors (I64). Every row holds one or more whole documents; positions restart at
// each document, the first label of each document is -100 (as DataCollatorWithFlattening does), and the
// tail of a row is padding: pad_id tokens forming their own document with labels -100.
struct MicroBatch {
  Tensor input_ids;
  Tensor labels;
  Tensor position_ids;
  int64_t valid_labels = 0;  // labels that count after the model's shift (Trainer's num_items_in_batch share)
  int64_t documents = 0;
  int64_t longest_row = 0;   // tokens before the padding in the batch's longest row
};

// Padding is never computed past what a batch needs: the columns [0, trimmed_columns) of a batch whose
// longest row holds `longest` tokens (rounded up to a multiple of 8, at most seq_len), so a batch of short
// documents costs their tokens, not seq_len (Transformers' collators pad to the longest row, too).
int64_t trimmed_columns(int64_t longest, int64_t seq_len);
// The first `columns` columns of every row (a copy; labels past them are all -100, so valid_labels and the
// loss are unchanged). columns in [longest_row, S].
MicroBatch micro_batch_trimmed(const MicroBatch& mb, int64_t columns);

struct LoaderOptions {
  int64_t micro_batch_size = 1;
  int64_t seq_len = 4096;
  bool pack = true;      // false: one document per row
  bool shuffle = true;   // a new seeded permutation of the documents every epoch
  uint64_t seed = 1234;
  int64_t epochs = 1;
  int32_t pad_id = 0;
};

// Where the loader is: resuming from it continues with exactly the batches an uninterrupted run would get.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t cursor = 0;  // documents of this epoch's permutation already consumed
};

class DataLoader {
 public:
  DataLoader(const Dataset& data, const LoaderOptions& options);
  // Fills `out` and returns true, or returns false once every epoch is consumed. A batch never mixes
  // epochs; the last batch of an epoch may have fewer rows.
  bool next(MicroBatch& out);
  LoaderPosition position() const { return pos_; }
  void restore(const LoaderPosition& p);
  // Micro-batches one epoch yields (for progress/ETA and schedules driven by epochs): a dry run over the
  // current epoch's order. With pack && shuffle another epoch may differ by a batch or so.
  int64_t batches_per_epoch() const;

 private:
  const Dataset* data_;
  LoaderOptions opt_;
  LoaderPosition pos_;
  std::vector<int64_t> order_;  // permutation of the current epoch
  void build_order();
};

}  // namespace mt
