#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/float_convert.h"
#include "core/memory.h"

namespace mt {

namespace {
DeviceAllocator g_cuda_alloc;
constexpr size_t kCpuAlign = 64;
}  // namespace

void register_cuda_allocator(DeviceAllocator a) { g_cuda_alloc = a; }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

std::shared_ptr<Storage> Storage::allocate(Device d, size_t nbytes) {
  auto s = std::shared_ptr<Storage>(new Storage());
  s->device_ = d;
  s->nbytes_ = nbytes;
  size_t n = nbytes == 0 ? kCpuAlign : (nbytes + kCpuAlign - 1) / kCpuAlign * kCpuAlign;
  if (d.is_cpu()) {
    s->data_ = std::aligned_alloc(kCpuAlign, n);
    if (!s->data_) fail("out of host memory allocating {} bytes", nbytes);
  } else {
    if (!g_cuda_alloc.alloc) fail("this build has no CUDA backend (asked for {} bytes on {})", nbytes, d.str());
    s->data_ = g_cuda_alloc.alloc(d.index, n);
  }
  s->owned_ = true;  // only now: a failed allocation must not be freed or un-counted by ~Storage
  memory_note_alloc(d, nbytes);
  return s;
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t nbytes, Device d, std::shared_ptr<void> keepalive) {
  auto s = std::shared_ptr<Storage>(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = d;
  s->owned_ = false;
  s->keepalive_ = std::move(keepalive);
  return s;
}

Storage::~Storage() {
  if (!owned_) return;
  if (device_.is_cpu())
    std::free(data_);
  else if (g_cuda_alloc.free)
    g_cuda_alloc.free(device_.index, data_);
  memory_note_free(device_, nbytes_);
}

namespace {
// The bytes a tensor of this shape needs; a negative dimension, or a size past what int64 element counts
// and size_t byte counts hold (a hostile seq_len, say), is an error instead of a wrapped-around allocation.
size_t checked_nbytes(const Shape& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail("negative dimension in shape {}", shape_str(shape));
    if (__builtin_mul_overflow(n, d, &n)) fail("shape {} has more elements than an int64 counts", shape_str(shape));
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(n), dtype_size(dtype), &bytes))
    fail("shape {} of {} needs more bytes than a size_t counts", shape_str(shape), dtype_torch_name(dtype));
  return bytes;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  const size_t nbytes = checked_nbytes(shape, dtype);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = Storage::allocate(device, nbytes);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_zero();
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> s, size_t byte_offset, const Shape& shape, DType dtype) {
  Tensor t;
  t.storage_ = std::move(s);
  t.offset_ = byte_offset;
  t.shape_ = shape;
  t.dtype_ = dtype;
  MT_CHECK(byte_offset + t.nbytes() <= t.storage_->nbytes(), "view {} at {} exceeds storage of {} bytes",
           t.desc(), byte_offset, t.storage_->nbytes());
  return t;
}

Tensor Tensor::absent(const Shape& shape, DType dtype, Device device) {
  checked_nbytes(shape, dtype);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = Storage::borrow(nullptr, 0, device, nullptr);
  return t;
}

bool Tensor::present() const { return storage_ && (storage_->data() != nullptr || nbytes() == 0); }

Tensor Tensor::from_floats(const Shape& shape, const std::vector<float>& v, DType dtype) {
  MT_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "{} values for shape {}", v.size(),
           shape_str(shape));
  Tensor f = empty(shape, DType::F32);
  std::memcpy(f.data(), v.data(), v.size() * sizeof(float));
  return dtype == DType::F32 ? f : f.to(dtype);
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  MT_CHECK(i >= 0 && i < n, "dim {} of a {}-d tensor", i, n);
  return shape_[i];
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

void* Tensor::data() const {
  MT_CHECK(storage_ != nullptr, "data() of an undefined tensor");
  MT_CHECK(storage_->data() != nullptr || nbytes() == 0, "data() of {}, whose bytes another rank holds", desc());
  return static_cast<char*>(storage_->data()) + offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  MT_CHECK(shape_numel(shape) == numel(), "view {} as {}", desc(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  MT_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "rows [{}, {}) of {}", begin, end,
           desc());
  Tensor t = *this;
  int64_t row = numel() / (shape_[0] == 0 ? 1 : shape_[0]);
  if (shape_[0] == 0) row = 0;
  t.offset_ = offset_ + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  MT_CHECK(device().is_cpu(), "clone on {} needs the device backend", device().str());
  std::memcpy(t.data(), data(), nbytes());
  return t;
}

namespace {
// Element i of a buffer that may be mis-aligned for its type (a foreign safetensors file need not
// align its data section), so every read goes through memcpy.
template <typename T>
T load_raw(const void* p, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return load_raw<float>(p, i);
    case DType::BF16: return bf16_to_float(load_raw<uint16_t>(p, i));
    case DType::F16: return f16_to_float(load_raw<uint16_t>(p, i));
    case DType::F64: return static_cast<float>(load_raw<double>(p, i));
    case DType::F8_E4M3: return fp8_e4m3_to_float(load_raw<uint8_t>(p, i));
    case DType::F8_E5M2: return fp8_e5m2_to_float(load_raw<uint8_t>(p, i));
    case DType::F8_E8M0: return fp8_e8m0_to_float(load_raw<uint8_t>(p, i));
    case DType::I32: return static_cast<float>(load_raw<int32_t>(p, i));
    case DType::I64: return static_cast<float>(load_raw<int64_t>(p, i));
    case DType::U8: return static_cast<float>(load_raw<uint8_t>(p, i));
    case DType::Bool: return load_raw<uint8_t>(p, i) ? 1.0f : 0.0f;
    case DType::I8: return static_cast<float>(load_raw<int8_t>(p, i));
    case DType::I16: return static_cast<float>(load_raw<int16_t>(p, i));
    case DType::U16: return static_cast<float>(load_raw<uint16_t>(p, i));
    case DType::U32: return static_cast<float>(load_raw<uint32_t>(p, i));
    case DType::U64: return static_cast<float>(load_raw<uint64_t>(p, i));
  }
  return 0.0f;
}

void store_from_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; return;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); return;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16(v); return;
    case DType::F64: static_cast<double*>(p)[i] = v; return;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    default: fail("conversion to {} is not supported", dtype_safetensors_name(t));
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  MT_CHECK(src.shape_ == shape_, "copy {} into {}", src.desc(), desc());
  MT_CHECK(device().is_cpu() && src.device().is_cpu(), "copy_from across devices needs the device backend");
  if (src.dtype_ == dtype_) {
    std::memmove(data(), src.data(), nbytes());
    return;
  }
  const int64_t n = numel();
  if (src.dtype_ == DType::F64 && dtype_ == DType::F32) {
    auto* d = data_as<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(load_raw<double>(src.data(), i));
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_from_float(data(), dtype_, i, load_as_float(src.data(), src.dtype_, i));
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype, device());
  t.copy_from(*this);
  return t;
}

void Tensor::fill_zero() {
  MT_CHECK(device().is_cpu(), "fill_zero on {} needs the device backend", device().str());
  std::memset(data(), 0, nbytes());
}

std::vector<float> Tensor::to_floats() const {
  MT_CHECK(device().is_cpu(), "to_floats on {}", device().str());
  std::vector<float> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[i] = load_as_float(data(), dtype_, i);
  return v;
}

std::string Tensor::desc() const { return std::string(dtype_safetensors_name(dtype_)) + shape_str(shape_); }

}  // namespace mt
