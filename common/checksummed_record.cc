// Copyright 2026 The ckptd Authors.
#include "common/checksummed_record.h"

#include <cstdint>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/crc32.h"
#include "fmt/format.h"

namespace ckptd {
namespace {

constexpr std::string_view kMagic = "ckptd-state v1 ";

}  // namespace

std::string WrapChecksummed(std::string_view body) {
  return fmt::format("{}{:08x} {}\n{}", kMagic,
                     Crc32(0, body.data(), body.size()), body.size(), body);
}

absl::StatusOr<std::optional<std::string_view>> UnwrapChecksummed(
    std::string_view text, std::string_view what) {
  if (!text.starts_with(kMagic)) return std::optional<std::string_view>();
  const size_t nl = text.find('\n');
  if (nl == std::string_view::npos) {
    return absl::DataLossError(fmt::format("{}: truncated header", what));
  }
  const std::string_view header =
      text.substr(kMagic.size(), nl - kMagic.size());
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(header.data(), header.size()), ' ');
  uint32_t crc = 0;
  uint64_t len = 0;
  if (parts.size() != 2 || parts[0].size() != 8 ||
      !absl::SimpleHexAtoi(parts[0], &crc) ||
      !absl::SimpleAtoi(parts[1], &len) || len > kMaxChecksummedBody) {
    return absl::DataLossError(fmt::format("{}: malformed header", what));
  }
  const std::string_view body = text.substr(nl + 1);
  if (body.size() != len) {
    return absl::DataLossError(
        fmt::format("{}: body is {} bytes, the header says {} (torn write?)",
                    what, body.size(), len));
  }
  if (Crc32(0, body.data(), body.size()) != crc) {
    return absl::DataLossError(fmt::format("{}: checksum mismatch", what));
  }
  return std::optional<std::string_view>(body);
}

}  // namespace ckptd
