// Copyright 2026 The ckptd Authors.
#include "format/tensor/dtype.h"

#include <array>

#include "fmt/format.h"

namespace ckptd::format {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  std::string_view name;
  std::string_view storage;  // empty: no legacy storage class
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {DType::kFloat64, 8, "float64", "DoubleStorage"},
    {DType::kFloat32, 4, "float32", "FloatStorage"},
    {DType::kFloat16, 2, "float16", "HalfStorage"},
    {DType::kBFloat16, 2, "bfloat16", "BFloat16Storage"},
    {DType::kComplex128, 16, "complex128", "ComplexDoubleStorage"},
    {DType::kComplex64, 8, "complex64", "ComplexFloatStorage"},
    {DType::kInt64, 8, "int64", "LongStorage"},
    {DType::kInt32, 4, "int32", "IntStorage"},
    {DType::kInt16, 2, "int16", "ShortStorage"},
    {DType::kInt8, 1, "int8", "CharStorage"},
    {DType::kUInt8, 1, "uint8", "ByteStorage"},
    {DType::kBool, 1, "bool", "BoolStorage"},
    {DType::kFloat8E4M3FN, 1, "float8_e4m3fn", ""},
    {DType::kFloat8E5M2, 1, "float8_e5m2", ""},
    {DType::kFloat8E4M3FNUZ, 1, "float8_e4m3fnuz", ""},
    {DType::kFloat8E5M2FNUZ, 1, "float8_e5m2fnuz", ""},
    {DType::kUInt16, 2, "uint16", ""},
    {DType::kUInt32, 4, "uint32", ""},
    {DType::kUInt64, 8, "uint64", ""},
}};

struct Alias {
  std::string_view alias;
  DType dtype;
};
constexpr std::array<Alias, 8> kAliases = {{
    {"float", DType::kFloat32},
    {"double", DType::kFloat64},
    {"half", DType::kFloat16},
    {"long", DType::kInt64},
    {"int", DType::kInt32},
    {"short", DType::kInt16},
    {"cfloat", DType::kComplex64},
    {"cdouble", DType::kComplex128},
}};

const DTypeInfo& Info(DType d) { return kInfo[static_cast<size_t>(d)]; }

}  // namespace

size_t ElementSize(DType dtype) { return Info(dtype).size; }
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> DTypeFromName(std::string_view name) {
  for (const auto& i : kInfo) {
    if (i.name == name) return i.dtype;
  }
  for (const auto& a : kAliases) {
    if (a.alias == name) return a.dtype;
  }
  return absl::InvalidArgumentError(fmt::format("unknown dtype 'torch.{}'", name));
}

std::optional<std::string_view> LegacyStorageClass(DType dtype) {
  if (Info(dtype).storage.empty()) return std::nullopt;
  return Info(dtype).storage;
}

absl::StatusOr<DType> DTypeFromStorageClass(std::string_view storage_class) {
  for (const auto& i : kInfo) {
    if (!i.storage.empty() && i.storage == storage_class) return i.dtype;
  }
  return absl::InvalidArgumentError(
      fmt::format("unknown storage class 'torch.{}'", storage_class));
}

}  // namespace ckptd::format
