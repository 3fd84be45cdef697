// Element types. The enum order is the safetensors serialization order (ascending), so
// the writer can sort "dtype descending" by comparing enum values.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mt {

enum class DType : uint8_t {
  Bool,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
};

size_t dtype_size(DType t);
bool dtype_is_float(DType t);
// Safetensors header spelling: "BF16", "F32", "F8_E4M3", ...
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors_name(std::string_view name);
// PyTorch / config.json spelling: "bfloat16", "float32", "float16", ...
std::string_view dtype_torch_name(DType t);
std::optional<DType> dtype_from_torch_name(std::string_view name);  // accepts "torch.bfloat16" too

}  // namespace mt
