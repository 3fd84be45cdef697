#include "kernels/cpu/seq_segments.h"

#include "core/error.h"

namespace mt::cpu {

std::vector<SeqSegment> row_segments(int64_t batch, int64_t seq) {
  std::vector<SeqSegment> r;
  for (int64_t b = 0; b < batch; ++b) r.push_back({b * seq, seq});
  return r;
}

std::vector<SeqSegment> document_segments(const Tensor& doc_ids, int64_t batch, int64_t seq) {
  if (!doc_ids.defined()) return row_segments(batch, seq);
  MT_CHECK(doc_ids.dtype() == DType::I32 && doc_ids.shape() == Shape({batch, seq}), "document ids {} for [{}, {}]",
           doc_ids.desc(), batch, seq);
  const int32_t* d = doc_ids.data_as<int32_t>();
  std::vector<SeqSegment> r;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) {
      if (s == 0 || d[b * seq + s] != d[b * seq + s - 1])
        r.push_back({b * seq + s, 1});
      else
        ++r.back().length;
    }
  return r;
}

void check_segments(const std::vector<SeqSegment>& segs, int64_t tokens) {
  int64_t next = 0;
  for (const SeqSegment& s : segs) {
    MT_CHECK(s.start == next && s.length >= 1, "segment [{}, +{}) after token {}", s.start, s.length, next);
    next += s.length;
  }
  MT_CHECK(next == tokens, "segments cover {} of {} tokens", next, tokens);
}

}  // namespace mt::cpu
