// Copyright 2026 The ckptd Authors.
//
// The safetensors container (github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape": [...],
//    "data_offsets": [begin, end]}, ...}
// and the data section, each tensor's bytes row-major and little-endian at
// [begin, end) of it.
//
// DCP writes it per data file with FileSystemWriter(serialization_format=
// SerializationFormat.SAFETENSORS) (torch >= 2.8, the Hugging Face storage
// writer's format): the file's bytes items first (raw, as usual), then one
// safetensors blob of the file's tensor chunks keyed by fqn. Every chunk's
// _StorageInfo.offset is where that blob starts (dcp-format.md).
#ifndef CKPTD_FORMAT_CONVERT_SAFETENSORS_H_
#define CKPTD_FORMAT_CONVERT_SAFETENSORS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "format/tensor/dtype.h"

namespace ckptd::format {

// "F32" ↔ DType::kFloat32; nullopt for names ckptd has no dtype for (and
// complex dtypes, which safetensors cannot hold).
std::optional<DType> DTypeFromSafetensors(std::string_view name);
std::optional<std::string_view> SafetensorsDTypeName(DType dtype);

struct SafetensorsTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // absolute file offsets of its bytes
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;  // absolute file offset of the data section
  absl::flat_hash_map<std::string, SafetensorsTensor> tensors;
  absl::flat_hash_map<std::string, std::string> metadata;  // __metadata__
};

// True when the 8 bytes at `head` could start a safetensors blob whose
// header fits in `available` bytes (a cheap test before parsing).
bool LooksLikeSafetensors(const char head[8], uint64_t available);

// Reads and checks the header of the blob at `offset` of `file`: JSON well
// formed, known dtypes, shapes non-negative, each tensor's byte range
// exactly its shape's size and inside the file. Errors (DATA_LOSS, or
// RESOURCE_EXHAUSTED for a header over `max_header` bytes) name the file
// and offset.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const RandomAccessFile* file, uint64_t offset,
    uint64_t max_header = uint64_t{100} << 20);

// The 8-byte length and JSON header of a safetensors blob holding
// `tensors` in this order, each's data offsets relative to the data section
// (begin/end as given), padded with spaces to a multiple of 8 bytes as the
// safetensors library writes it. INVALID_ARGUMENT for a dtype safetensors
// has no name for.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<std::pair<std::string, SafetensorsTensor>>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata = {});

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CONVERT_SAFETENSORS_H_
