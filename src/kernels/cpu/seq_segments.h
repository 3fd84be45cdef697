// Runs of consecutive tokens that a recurrent op (causal conv1d, the SSD scan) treats as one sequence: a row of the
// batch, or a packed document inside a row. Tokens are numbered row-major over [B, S]; nothing crosses a segment's
// start (the conv window and the scan state begin at zero there).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt::cpu {

struct SeqSegment {
  int64_t start = 0;   // first token (row-major index into the B·S tokens)
  int64_t length = 0;  // >= 1
};

// One segment per row.
std::vector<SeqSegment> row_segments(int64_t batch, int64_t seq);
// One per packed document: doc_ids I32 [B, S] (models/decoder_model.h batch_document_ids), a new segment wherever
// the id changes within a row; undefined doc_ids: one per row.
std::vector<SeqSegment> document_segments(const Tensor& doc_ids, int64_t batch, int64_t seq);
// Throws unless the segments tile [0, tokens) in order, each of length >= 1 (an internal contract).
void check_segments(const std::vector<SeqSegment>& segs, int64_t tokens);

}  // namespace mt::cpu
