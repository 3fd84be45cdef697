// The head dims the flash-attention kernels are built for (flash_attention_tiles.cuh has one tile
// configuration per pair); flash_attention.cpp checks against this list, and the CUDA model asks it
// before choosing the GPU for a model.
#pragma once
#include <cstdint>

namespace mt::cuda {

// Queries, keys and values of one head size.
inline bool flash_attention_head_dim_supported(int64_t d) {
  return d == 16 || d == 32 || d == 64 || d == 128 || d == 256;
}
// Query/key head size qk and value (and output) head size v: the equal sizes above, and MLA's 192 / 128
// (DeepSeek-V3: 128 no-RoPE + 64 RoPE columns of q and k, 128 value columns).
inline bool flash_attention_dims_supported(int64_t qk, int64_t v) {
  return qk == v ? flash_attention_head_dim_supported(qk) : qk == 192 && v == 128;
}
inline const char* flash_attention_head_dims() { return "supported: 16, 32, 64, 128, 256"; }
inline const char* flash_attention_mla_dims() { return "supported: 192 with v_dim 128"; }

}  // namespace mt::cuda
