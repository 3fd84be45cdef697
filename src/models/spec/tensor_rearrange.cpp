#include "models/spec/tensor_rearrange.h"

#include <cstring>

#include "core/error.h"

namespace mt {

namespace {

// Tensors here may borrow a memory-mapped file whose data need not be aligned: elements move through memcpy of a
// compile-time size, which compiles to plain loads and stores.
template <size_t ES>
void transpose_planes(const char* in, char* out, int64_t planes, int64_t a, int64_t b) {
  constexpr int64_t tile = 32;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i0 = 0; i0 < a; i0 += tile) {
      const char* src = in + p * a * b * static_cast<int64_t>(ES);
      char* dst = out + p * a * b * static_cast<int64_t>(ES);
      const int64_t i1 = std::min(a, i0 + tile);
      for (int64_t j0 = 0; j0 < b; j0 += tile) {
        const int64_t j1 = std::min(b, j0 + tile);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < j1; ++j) std::memcpy(dst + (j * a + i) * ES, src + (i * b + j) * ES, ES);
      }
    }
}

void check_same(const Tensor& in, const Tensor& out, const Shape& want, const char* op) {
  MT_CHECK(in.dtype() == out.dtype() && out.shape() == want, "{}: {} into {}", op, in.desc(), out.desc());
}

// Moves rows of `inner` elements between in and out along `dim` viewed as [outer, 2n, inner].
void interleave_rows(const Tensor& in, int dim, Tensor& out, bool deinterleave) {
  check_same(in, out, in.shape(), deinterleave ? "deinterleave" : "interleave");
  MT_CHECK(dim >= 0 && dim < in.ndim() && in.dim(dim) % 2 == 0, "(de)interleave dim {} of {}", dim, in.desc());
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= in.dim(i);
  for (int i = dim + 1; i < in.ndim(); ++i) inner *= in.dim(i);
  const int64_t n = in.dim(dim) / 2, run = inner * static_cast<int64_t>(dtype_size(in.dtype()));
  const char* src = static_cast<const char*>(in.data());
  char* dst = static_cast<char*>(out.data());
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < 2 * n; ++i) {
      const int64_t packed = i < n ? 2 * i : 2 * (i - n) + 1;  // position in the interleaved order
      const int64_t from = deinterleave ? packed : i, to = deinterleave ? i : packed;
      std::memcpy(dst + (o * 2 * n + to) * run, src + (o * 2 * n + from) * run, static_cast<size_t>(run));
    }
}

}  // namespace

void transpose_last2_into(const Tensor& in, Tensor& out) {
  MT_CHECK(in.ndim() >= 2, "transpose of {}", in.desc());
  Shape want = in.shape();
  std::swap(want[want.size() - 1], want[want.size() - 2]);
  check_same(in, out, want, "transpose");
  const int64_t a = in.dim(-2), b = in.dim(-1), planes = a * b == 0 ? 0 : in.numel() / (a * b);
  const char* src = static_cast<const char*>(in.data());
  char* dst = static_cast<char*>(out.data());
  switch (dtype_size(in.dtype())) {
    case 1: transpose_planes<1>(src, dst, planes, a, b); break;
    case 2: transpose_planes<2>(src, dst, planes, a, b); break;
    case 4: transpose_planes<4>(src, dst, planes, a, b); break;
    case 8: transpose_planes<8>(src, dst, planes, a, b); break;
    default: MT_CHECK(false, "transpose of element size {}", dtype_size(in.dtype()));
  }
}

void deinterleave_into(const Tensor& in, int dim, Tensor& out) { interleave_rows(in, dim, out, true); }
void interleave_into(const Tensor& in, int dim, Tensor& out) { interleave_rows(in, dim, out, false); }

Box Box::whole(const Tensor& t) { return Box{t, Shape(t.shape().size(), 0), t.shape(), 0}; }

Box Box::index(int64_t i) const {
  MT_CHECK(lead < static_cast<int>(size.size()) && i >= 0 && i < size[lead], "box index {} of {}", i,
           shape_str(shape()));
  Box b = *this;
  b.lo[lead] += i;
  b.size[lead] = 1;
  ++b.lead;
  return b;
}

Box Box::slice(int dim, int64_t begin, int64_t length) const {
  const size_t d = static_cast<size_t>(lead + dim);
  MT_CHECK(d < size.size() && begin >= 0 && length >= 0 && begin + length <= size[d], "box slice [{}, +{}) of dim {} of {}",
           begin, length, dim, shape_str(shape()));
  Box b = *this;
  b.lo[d] += begin;
  b.size[d] = length;
  return b;
}

bool Box::contiguous() const {
  // Contiguous iff every dim after the last partial one is whole and every dim before it has extent 1.
  int last_partial = -1;
  for (size_t i = 0; i < size.size(); ++i)
    if (size[i] != base.shape()[i]) last_partial = static_cast<int>(i);
  for (int i = 0; i < last_partial; ++i)
    if (size[i] != 1) return false;
  return true;
}

namespace {
int64_t linear_offset(const Box& b) {
  int64_t off = 0;
  for (size_t i = 0; i < b.size.size(); ++i) off = off * b.base.shape()[i] + b.lo[i];
  return off;
}
}  // namespace

Tensor Box::view() const {
  MT_CHECK(contiguous(), "view of a strided box of {}", base.desc());
  const int64_t n = shape_numel(size), off = linear_offset(*this);
  return base.view({base.numel()}).rows(off, off + n).view(shape());
}

namespace {
// Calls f(element offset in base, elements) for every contiguous run of a (strided) box, in row-major order.
template <typename F>
void box_runs(const Box& b, F&& f) {
  const Shape& full = b.base.shape();
  int k = static_cast<int>(b.size.size()) - 1;  // the last partial dim
  while (k > 0 && b.size[k] == full[k]) --k;
  int64_t run = b.size[k];
  for (size_t i = static_cast<size_t>(k) + 1; i < full.size(); ++i) run *= full[i];
  if (run == 0 || shape_numel(b.size) == 0) return;
  Shape idx(static_cast<size_t>(k), 0);
  while (true) {
    int64_t off = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      const int64_t at = i < static_cast<size_t>(k) ? b.lo[i] + idx[i] : b.lo[i];
      off = off * full[i] + at;
    }
    f(off, run);
    int i = k - 1;
    for (; i >= 0; --i) {
      if (++idx[i] < b.size[i]) break;
      idx[i] = 0;
    }
    if (i < 0) return;
  }
}
}  // namespace

Tensor Box::read() const {
  if (!base.present()) return Tensor::absent(shape(), base.dtype(), base.device());
  if (contiguous()) return view();
  Tensor out = Tensor::empty(shape(), base.dtype());
  const size_t es = dtype_size(base.dtype());
  const char* src = static_cast<const char*>(base.data());
  char* dst = static_cast<char*>(out.data());
  int64_t at = 0;
  box_runs(*this, [&](int64_t off, int64_t n) {
    std::memcpy(dst + at * es, src + off * es, static_cast<size_t>(n) * es);
    at += n;
  });
  return out;
}

void Box::write(const Tensor& src) const {
  MT_CHECK(src.shape() == shape() && src.dtype() == base.dtype(), "write {} into a box {} of {}", src.desc(),
           shape_str(shape()), base.desc());
  if (contiguous()) {
    Tensor v = view();
    v.copy_from(src);
    return;
  }
  const size_t es = dtype_size(base.dtype());
  const char* from = static_cast<const char*>(src.data());
  char* dst = static_cast<char*>(base.data());
  int64_t at = 0;
  box_runs(*this, [&](int64_t off, int64_t n) {
    std::memcpy(dst + off * es, from + at * es, static_cast<size_t>(n) * es);
    at += n;
  });
}

}  // namespace mt
