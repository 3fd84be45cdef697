#include "io/npy.h"

#include <cstdio>
#include <string>
#include <string_view>

#include "core/error.h"
#include "io/atomic_file.h"

namespace mt {

void npy_write_f32(const std::string& path, const Tensor& t) {
  MT_CHECK(t.dtype() == DType::F32 && t.device().is_cpu(), "npy_write_f32 of {}", t.desc());
  std::string shape = "(";
  for (int i = 0; i < t.ndim(); ++i) shape += (i ? ", " : "") + std::to_string(t.dim(i));
  if (t.ndim() == 1) shape += ",";
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  // magic(6) + version(2) + header_len(2) + header + '\n' must be a multiple of 64.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string bytes = "\x93NUMPY";
  bytes.push_back('\x01');
  bytes.push_back('\x00');
  bytes.push_back(static_cast<char>(header.size() & 0xff));
  bytes.push_back(static_cast<char>((header.size() >> 8) & 0xff));
  bytes += header;
  file_write_atomic(path, {bytes, std::string_view(static_cast<const char*>(t.data()), t.nbytes())});
}

}  // namespace mt
