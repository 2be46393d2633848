// Copyright 2026 The ckptd Authors.
//
// Tensor element types as PyTorch names them, with their element sizes and
// the pickle GLOBALs torch.save uses for them (dcp-format.md §2.1, §3.2).
#ifndef CKPTD_FORMAT_TENSOR_DTYPE_H_
#define CKPTD_FORMAT_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"

namespace ckptd::format {

enum class DType : uint8_t {
  // The twelve dtypes with a legacy typed storage class (_rebuild_tensor_v2).
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kComplex128,
  kComplex64,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  // Newer dtypes, saved as UntypedStorage + dtype (_rebuild_tensor_v3).
  kFloat8E4M3FN,
  kFloat8E5M2,
  kFloat8E4M3FNUZ,
  kFloat8E5M2FNUZ,
  kUInt16,
  kUInt32,
  kUInt64,
};

inline constexpr int kNumDTypes = 19;
inline constexpr int kNumLegacyDTypes = 12;

// Bytes per element.
size_t ElementSize(DType dtype);
// torch attribute name, which is also the pickle GLOBAL name: "float32".
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName; also accepts torch's aliases ("float", "double",
// "half", "long", "int", "short", "cfloat", "cdouble").
absl::StatusOr<DType> DTypeFromName(std::string_view name);
// Legacy storage class name ("FloatStorage"), or nullopt for v3-only dtypes.
std::optional<std::string_view> LegacyStorageClass(DType dtype);
// Inverse of LegacyStorageClass.
absl::StatusOr<DType> DTypeFromStorageClass(std::string_view storage_class);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_TENSOR_DTYPE_H_
