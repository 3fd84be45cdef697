// DataLoader: seeded per-epoch permutation, greedy packing of whole documents into rows, resumable.
#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "data/dataset.h"

namespace mt {

namespace {
int64_t doc_len(const Dataset& d, int64_t i) { return static_cast<int64_t>(d.examples()[i].input_ids.size()); }

// How many documents from order[cursor..] one row takes (at least one). Greedy, in order, no look-ahead,
// so a row's content depends only on the cursor: that is what makes restore() exact.
int64_t row_take(const Dataset& d, const std::vector<int64_t>& order, int64_t cursor, int64_t seq_len, bool pack) {
  const int64_t n = static_cast<int64_t>(order.size());
  int64_t used = 0, taken = 0;
  while (cursor + taken < n) {
    const int64_t len = doc_len(d, order[cursor + taken]);
    if (taken > 0 && (!pack || used + len > seq_len)) break;
    used += len;
    ++taken;
  }
  return taken;
}
}  // namespace

DataLoader::DataLoader(const Dataset& data, const LoaderOptions& options) : data_(&data), opt_(options) {
  if (opt_.micro_batch_size < 1) fail("train.micro_batch_size: must be at least 1, found {}", opt_.micro_batch_size);
  if (opt_.seq_len < 1) fail("data.seq_len: must be at least 1, found {}", opt_.seq_len);
  if (opt_.epochs < 0) fail("train.epochs: must not be negative, found {}", opt_.epochs);
  if (data.examples().empty()) fail("data loader: the dataset has no examples");
  for (size_t i = 0; i < data.examples().size(); ++i) {
    const Example& ex = data.examples()[i];
    MT_CHECK(!ex.input_ids.empty() && ex.labels.size() == ex.input_ids.size(), "example {} is malformed", i);
    if (static_cast<int64_t>(ex.input_ids.size()) > opt_.seq_len)
      fail("data loader: example {} has {} tokens, more than the loader's seq_len {} (load the dataset with the "
           "same seq_len)",
           i, ex.input_ids.size(), opt_.seq_len);
  }
  build_order();
}

void DataLoader::build_order() {
  const int64_t n = static_cast<int64_t>(data_->examples().size());
  order_.resize(n);
  for (int64_t i = 0; i < n; ++i) order_[i] = i;
  if (!opt_.shuffle) return;
  // Fisher-Yates with a stream per epoch: epoch e's order does not depend on how many draws earlier epochs made.
  Rng rng(opt_.seed, static_cast<uint64_t>(pos_.epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(i + 1));
    std::swap(order_[i], order_[j]);
  }
}

void DataLoader::restore(const LoaderPosition& p) {
  const int64_t n = static_cast<int64_t>(data_->examples().size());
  if (p.epoch < 0 || p.cursor < 0 || p.cursor > n)
    fail("data loader: cannot restore position epoch {} cursor {} (dataset has {} examples)", p.epoch, p.cursor, n);
  pos_ = p;
  build_order();
}

bool DataLoader::next(MicroBatch& out) {
  const int64_t n = static_cast<int64_t>(order_.size());
  if (pos_.cursor >= n && pos_.epoch < opt_.epochs) {  // e.g. restored at the very end of an epoch
    ++pos_.epoch;
    pos_.cursor = 0;
    build_order();
  }
  if (pos_.epoch >= opt_.epochs) return false;

  const int64_t S = opt_.seq_len;
  // Rows first, so the tensors have the batch's real row count (the last batch of an epoch may be short).
  std::vector<std::pair<int64_t, int64_t>> rows;  // (first cursor, documents)
  int64_t cursor = pos_.cursor;
  while (static_cast<int64_t>(rows.size()) < opt_.micro_batch_size && cursor < n) {
    const int64_t take = row_take(*data_, order_, cursor, S, opt_.pack);
    rows.emplace_back(cursor, take);
    cursor += take;
  }
  const int64_t B = static_cast<int64_t>(rows.size());
  out.input_ids = Tensor::empty({B, S}, DType::I64);
  out.labels = Tensor::empty({B, S}, DType::I64);
  out.position_ids = Tensor::empty({B, S}, DType::I64);
  out.valid_labels = 0;
  out.documents = 0;
  out.longest_row = 0;
  for (int64_t r = 0; r < B; ++r) {
    int64_t* ids = out.input_ids.data_as<int64_t>() + r * S;
    int64_t* lab = out.labels.data_as<int64_t>() + r * S;
    int64_t* pos = out.position_ids.data_as<int64_t>() + r * S;
    int64_t t = 0;
    for (int64_t k = 0; k < rows[r].second; ++k) {
      const Example& ex = data_->examples()[order_[rows[r].first + k]];
      const int64_t len = static_cast<int64_t>(ex.input_ids.size());
      for (int64_t i = 0; i < len; ++i, ++t) {
        ids[t] = ex.input_ids[i];
        // The first token of a document has nothing before it in the document to predict it from.
        lab[t] = i == 0 ? -100 : ex.labels[i];
        pos[t] = i;
      }
      ++out.documents;
    }
    out.longest_row = std::max(out.longest_row, t);
    for (int64_t i = 0; t < S; ++i, ++t) {
      ids[t] = opt_.pad_id;
      lab[t] = -100;
      pos[t] = i;
    }
    for (int64_t u = 1; u < S; ++u) out.valid_labels += lab[u] != -100;
  }
  pos_.cursor = cursor;
  if (pos_.cursor >= n) {
    ++pos_.epoch;
    pos_.cursor = 0;
    if (pos_.epoch < opt_.epochs) build_order();
  }
  return true;
}

int64_t DataLoader::batches_per_epoch() const {
  // Dry run over the current epoch's order. With packing and shuffling another epoch's count can
  // differ slightly (rows depend on the order); without packing it is exactly ceil(n / B).
  const int64_t n = static_cast<int64_t>(order_.size());
  int64_t batches = 0, cursor = 0;
  while (cursor < n) {
    for (int64_t r = 0; r < opt_.micro_batch_size && cursor < n; ++r)
      cursor += row_take(*data_, order_, cursor, opt_.seq_len, opt_.pack);
    ++batches;
  }
  return batches;
}

int64_t trimmed_columns(int64_t longest, int64_t seq_len) {
  return std::min(seq_len, std::max<int64_t>(8, (longest + 7) / 8 * 8));
}

MicroBatch micro_batch_trimmed(const MicroBatch& mb, int64_t columns) {
  const int64_t B = mb.input_ids.dim(0), S = mb.input_ids.dim(1);
  MT_CHECK(columns >= mb.longest_row && columns <= S, "micro-batch trimmed to {} columns (longest row {}, width {})",
           columns, mb.longest_row, S);
  if (columns == S) return mb;
  MicroBatch out = mb;
  auto cut = [&](const Tensor& t) {
    Tensor c = Tensor::empty({B, columns}, DType::I64);
    for (int64_t r = 0; r < B; ++r)
      std::copy_n(t.data_as<int64_t>() + r * S, columns, c.data_as<int64_t>() + r * columns);
    return c;
  };
  out.input_ids = cut(mb.input_ids);
  out.labels = cut(mb.labels);
  out.position_ids = cut(mb.position_ids);
  return out;
}

}  // namespace mt
