// Byte-exact rearrangements the checkpoint converters need (models/spec/hf_name_map.h): transpose of the last two
// dims, (de)interleave along one dim, and a "box" (a sub-block of a contiguous tensor: an expert's rows of a stack,
// the gate half of gate_up) that is a view when its bytes are contiguous and a strided copy otherwise. Any dtype:
// elements are moved, never converted.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt {

// out = in with the last two dims swapped; in [..., a, b], out [..., b, a], same dtype.
void transpose_last2_into(const Tensor& in, Tensor& out);
// Along `dim` (size 2n): out = [in[0], in[2], ..., in[2n-2], in[1], in[3], ..., in[2n-1]].
void deinterleave_into(const Tensor& in, int dim, Tensor& out);
// The inverse: out[2i] = in[i], out[2i+1] = in[n+i] along `dim`.
void interleave_into(const Tensor& in, int dim, Tensor& out);

// A sub-block of `base` (contiguous, row-major): per base dim an offset `lo` and extent `size`. The first `lead`
// dims have extent 1 and are not part of the box's own shape (they were fixed by indexing a stack).
struct Box {
  Tensor base;
  Shape lo, size;
  int lead = 0;

  static Box whole(const Tensor& t);
  Shape shape() const { return Shape(size.begin() + lead, size.end()); }
  Box index(int64_t i) const;                               // fixes dim 0 of the box's shape at i
  Box slice(int dim, int64_t begin, int64_t length) const;  // dim of the box's shape
  bool contiguous() const;
  Tensor view() const;   // contiguous boxes only; a view of an absent base is absent
  Tensor read() const;   // view() when contiguous, else a copy; absent when the base is
  void write(const Tensor& src) const;  // src: the box's shape and the base's dtype
};

}  // namespace mt
