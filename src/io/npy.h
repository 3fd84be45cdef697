// NumPy .npy writer (format 1.0, little-endian float32, C order), for `score --logits`.
#pragma once
#include <string>

#include "core/tensor.h"

namespace mt {

// Writes a CPU F32 tensor atomically; the file loads with numpy.load.
void npy_write_f32(const std::string& path, const Tensor& t);

}  // namespace mt
