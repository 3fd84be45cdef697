#include "core/dtype.h"

namespace mt {

namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  bool is_float;
  std::string_view st_name;
  std::string_view torch_name;
};
constexpr DTypeInfo kInfo[] = {
    {DType::Bool, 1, false, "BOOL", "bool"},
    {DType::U8, 1, false, "U8", "uint8"},
    {DType::I8, 1, false, "I8", "int8"},
    {DType::F8_E5M2, 1, true, "F8_E5M2", "float8_e5m2"},
    {DType::F8_E4M3, 1, true, "F8_E4M3", "float8_e4m3fn"},
    {DType::F8_E8M0, 1, true, "F8_E8M0", "float8_e8m0fnu"},
    {DType::I16, 2, false, "I16", "int16"},
    {DType::U16, 2, false, "U16", "uint16"},
    {DType::F16, 2, true, "F16", "float16"},
    {DType::BF16, 2, true, "BF16", "bfloat16"},
    {DType::I32, 4, false, "I32", "int32"},
    {DType::U32, 4, false, "U32", "uint32"},
    {DType::F32, 4, true, "F32", "float32"},
    {DType::F64, 8, true, "F64", "float64"},
    {DType::I64, 8, false, "I64", "int64"},
    {DType::U64, 8, false, "U64", "uint64"},
};
const DTypeInfo& info(DType t) { return kInfo[static_cast<size_t>(t)]; }
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
bool dtype_is_float(DType t) { return info(t).is_float; }
std::string_view dtype_safetensors_name(DType t) { return info(t).st_name; }
std::string_view dtype_torch_name(DType t) { return info(t).torch_name; }

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.st_name == name) return i.type;
  return std::nullopt;
}

std::optional<DType> dtype_from_torch_name(std::string_view name) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  if (name == "float" || name == "fp32") return DType::F32;
  if (name == "half" || name == "fp16") return DType::F16;
  if (name == "bf16") return DType::BF16;
  if (name == "double") return DType::F64;
  if (name == "long") return DType::I64;
  if (name == "int") return DType::I32;
  for (const auto& i : kInfo)
    if (i.torch_name == name) return i.type;
  return std::nullopt;
}

}  // namespace mt
