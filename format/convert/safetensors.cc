// Copyright 2026 The ckptd Authors.
#include "format/convert/safetensors.h"

#include <cstring>
#include <utility>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ckptd::format {
namespace {

using json = nlohmann::json;

constexpr std::pair<std::string_view, DType> kNames[] = {
    {"F64", DType::kFloat64},
    {"F32", DType::kFloat32},
    {"F16", DType::kFloat16},
    {"BF16", DType::kBFloat16},
    {"I64", DType::kInt64},
    {"I32", DType::kInt32},
    {"I16", DType::kInt16},
    {"I8", DType::kInt8},
    {"U8", DType::kUInt8},
    {"BOOL", DType::kBool},
    {"F8_E4M3", DType::kFloat8E4M3FN},
    {"F8_E5M2", DType::kFloat8E5M2},
    {"U16", DType::kUInt16},
    {"U32", DType::kUInt32},
    {"U64", DType::kUInt64},
};

uint64_t LoadLE64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// One tensor entry of the header; `where` names file, offset and tensor.
absl::StatusOr<SafetensorsTensor> ParseEntry(const json& e, uint64_t data_start,
                                             uint64_t file_size,
                                             const std::string& where) {
  if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() ||
      !e.contains("shape") || !e["shape"].is_array() ||
      !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
      e["data_offsets"].size() != 2) {
    return absl::DataLossError(fmt::format(
        "{}: entry is not {{\"dtype\", \"shape\", \"data_offsets\": [begin, "
        "end]}}",
        where));
  }
  SafetensorsTensor t;
  const std::string dtype = e["dtype"].get<std::string>();
  std::optional<DType> d = DTypeFromSafetensors(dtype);
  if (!d.has_value()) {
    return absl::DataLossError(fmt::format(
        "{}: dtype \"{}\" has no torch dtype ckptd reads", where, dtype));
  }
  t.dtype = *d;
  uint64_t bytes = ElementSize(t.dtype);
  for (const json& n : e["shape"]) {
    if (!n.is_number_unsigned() || n.get<uint64_t>() > (uint64_t{1} << 48)) {
      return absl::DataLossError(fmt::format(
          "{}: shape {} is not a list of sizes", where, e["shape"].dump()));
    }
    t.shape.push_back(n.get<int64_t>());
    const uint64_t s = n.get<uint64_t>();
    if (s != 0 && bytes > file_size / s + 1) {
      return absl::DataLossError(fmt::format(
          "{}: shape {} is larger than the file", where, e["shape"].dump()));
    }
    bytes *= s;
  }
  const json& o = e["data_offsets"];
  if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned()) {
    return absl::DataLossError(
        fmt::format("{}: data_offsets {} are not offsets", where, o.dump()));
  }
  const uint64_t begin = o[0].get<uint64_t>(), end = o[1].get<uint64_t>();
  if (begin > end || end - begin != bytes || data_start > file_size ||
      end > file_size - data_start) {
    return absl::DataLossError(fmt::format(
        "{}: data_offsets [{}, {}) do not hold its {} bytes inside the file "
        "({} bytes, data section at {})",
        where, begin, end, bytes, file_size, data_start));
  }
  t.begin = data_start + begin;
  t.end = data_start + end;
  return t;
}

}  // namespace

std::optional<DType> DTypeFromSafetensors(std::string_view name) {
  for (const auto& [n, d] : kNames) {
    if (n == name) return d;
  }
  return std::nullopt;
}

std::optional<std::string_view> SafetensorsDTypeName(DType dtype) {
  for (const auto& [n, d] : kNames) {
    if (d == dtype) return n;
  }
  return std::nullopt;
}

bool LooksLikeSafetensors(const char head[8], uint64_t available) {
  const uint64_t n = LoadLE64(head);
  // The JSON header starts with '{' right after the length.
  return n >= 2 && available >= 8 && n <= available - 8;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const RandomAccessFile* file, uint64_t offset, uint64_t max_header) {
  const uint64_t size = file->Size();
  const std::string at = fmt::format("{} @ {}", file->path(), offset);
  if (offset > size || size - offset < 10) {
    return absl::DataLossError(
        fmt::format("{}: too short for a safetensors header", at));
  }
  char head[8];
  RETURN_IF_ERROR(file->ReadExact(offset, 8, head));
  const uint64_t n = LoadLE64(head);
  if (n > max_header) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: safetensors header of {} bytes exceeds the limit of {}", at, n,
        max_header));
  }
  if (n < 2 || n > size - offset - 8) {
    return absl::DataLossError(fmt::format(
        "{}: safetensors header length {} does not fit the file ({} bytes)", at,
        n, size));
  }
  std::string text(n, '\0');
  RETURN_IF_ERROR(file->ReadExact(offset + 8, n, text.data()));
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) {
    return absl::DataLossError(
        fmt::format("{}: safetensors header is not a JSON object", at));
  }
  SafetensorsHeader h;
  h.data_start = offset + 8 + n;
  for (const auto& [name, e] : doc.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) {
        return absl::DataLossError(
            fmt::format("{}: __metadata__ is not an object", at));
      }
      for (const auto& [k, v] : e.items()) {
        if (v.is_string()) h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(
        SafetensorsTensor t,
        ParseEntry(e, h.data_start, size,
                   fmt::format("{}: safetensors tensor '{}'", at, name)));
    h.tensors.emplace(name, std::move(t));
  }
  return h;
}

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<std::pair<std::string, SafetensorsTensor>>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    doc["__metadata__"] = std::move(m);
  }
  for (const auto& [name, t] : tensors) {
    std::optional<std::string_view> dtype = SafetensorsDTypeName(t.dtype);
    if (!dtype.has_value()) {
      return absl::InvalidArgumentError(
          fmt::format("tensor '{}': safetensors has no dtype for {}", name,
                      DTypeName(t.dtype)));
    }
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(*dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {t.begin, t.end};
    doc[name] = std::move(e);
  }
  std::string text =
      doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
  return out + text;
}

}  // namespace ckptd::format
