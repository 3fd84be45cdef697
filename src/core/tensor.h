// A dense, contiguous, row-major tensor: shared storage + byte offset + shape + dtype.
// No strides on purpose: every op reads and writes contiguous buffers, as in llm.c; a
// "view" is a byte range of the same storage (reshape, or a run of rows along dim 0).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace mt {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// Owned bytes on one device, or borrowed bytes (a memory-mapped file) kept alive by `keepalive`.
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(Device d, size_t nbytes);
  static std::shared_ptr<Storage> borrow(void* data, size_t nbytes, Device d, std::shared_ptr<void> keepalive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool owned() const { return owned_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool owned_ = false;
  std::shared_ptr<void> keepalive_;
};

// Backends register how they allocate device memory (the CUDA backend does so when linked).
struct DeviceAllocator {
  void* (*alloc)(int index, size_t nbytes) = nullptr;
  void (*free)(int index, void* p) = nullptr;
};
void register_cuda_allocator(DeviceAllocator a);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Host tensors only (a device tensor stops with "fill_zero on cuda:N needs the device backend"): CUDA code
  // zeroes with cuda::fill_zero_async on its stream.
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor from_storage(std::shared_ptr<Storage> s, size_t byte_offset, const Shape& shape, DType dtype);
  // CPU helpers for tests and small host-side data.
  static Tensor from_floats(const Shape& shape, const std::vector<float>& v, DType dtype = DType::F32);
  // A tensor whose bytes live elsewhere (a parameter another rank holds when a job shards its parameters):
  // shape, dtype and device only. defined() is true, present() false; data() throws, on it and its views.
  static Tensor absent(const Shape& shape, DType dtype, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  bool present() const;
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

  void* data() const;
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  Tensor view(const Shape& shape) const;                 // same bytes, new shape (numel must match)
  Tensor rows(int64_t begin, int64_t end) const;         // [begin, end) along dim 0
  Tensor operator[](int64_t i) const { return rows(i, i + 1).view(Shape(shape_.begin() + 1, shape_.end())); }
  Tensor clone() const;                                  // deep copy, same device and dtype
  Tensor to(DType dtype) const;                          // CPU only: converting copy (float types round RNE)
  void copy_from(const Tensor& src);                     // same shape; converts dtype on the CPU
  void fill_zero();
  std::vector<float> to_floats() const;                  // CPU only: every element as float
  std::string desc() const;                              // "BF16[2, 3]"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace mt
