// Copyright 2026 The ckptd Authors.
//
// The frame of the daemon's state files (the journal and history records
// of daemon/commit/state_record.h, the memory tier's manifests of
// daemon/tier/tier_store.h): a header with the CRC-32 and length of the
// body, so that a torn or edited file is reported, never half-read.
//
//   ckptd-state v1 <crc32 of the body, 8 hex digits> <body length>\n
//   <body>
//
// Pure functions; thread-safe.
#ifndef CKPTD_COMMON_CHECKSUMMED_RECORD_H_
#define CKPTD_COMMON_CHECKSUMMED_RECORD_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ckptd {

inline constexpr size_t kMaxChecksummedBody = size_t{64} << 20;

// `body` framed.
std::string WrapChecksummed(std::string_view body);

// The body of a framed `text`, checked (DATA_LOSS naming `what` for a bad
// header, length or checksum); nullopt if `text` has no frame at all (a
// file in an earlier, unframed format). The view points into `text`.
absl::StatusOr<std::optional<std::string_view>> UnwrapChecksummed(
    std::string_view text, std::string_view what);

}  // namespace ckptd

#endif  // CKPTD_COMMON_CHECKSUMMED_RECORD_H_
