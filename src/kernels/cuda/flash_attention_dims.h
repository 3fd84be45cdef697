// The head dims the flash-attention kernels are built for (flash_attention_tiles.cuh has one tile
// configuration per dim); flash_attention.cpp checks against this list, and the CUDA model asks it
// before choosing the GPU for a model.
#pragma once
#include <cstdint>

namespace mt::cuda {

inline bool flash_attention_head_dim_supported(int64_t d) {
  return d == 16 || d == 32 || d == 64 || d == 128 || d == 256;
}
inline const char* flash_attention_head_dims() { return "supported: 16, 32, 64, 128, 256"; }

}  // namespace mt::cuda
