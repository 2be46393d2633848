// Copyright 2026 The ckptd Authors.
//
// What a bytes item of a DCP checkpoint must be (dcp-format.md §5): a
// torch.save archive whose records match their CRC-32s and whose data.pkl
// parses with the bounded pickle VM (nothing runs). The daemon checks this
// before it commits a bytes item a client handed in, and `verify` checks
// it of every bytes item it reads; both call CheckBytesItem, so the daemon
// never commits a bytes item its own verify rejects.
#ifndef CKPTD_FORMAT_TENSOR_BYTES_ITEM_H_
#define CKPTD_FORMAT_TENSOR_BYTES_ITEM_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/zip/zip.h"

namespace ckptd::format {

struct BytesItemCheck {
  // Globals the pickle references outside IsAllowedPickleGlobal's
  // allowlist ("module.name", each once, in first-seen order): loading the
  // item with a full unpickler could run them.
  std::vector<std::string> unsafe_globals;
  uint64_t crc_bytes = 0;  // bytes run through CRC-32
};

// Checks the archive of bytes item `fqn` (CRCs when `check_crc`).
// INVALID_ARGUMENT / DATA_LOSS naming the record for a bad archive.
absl::StatusOr<BytesItemCheck> CheckBytesItem(const ZipArchiveReader& archive,
                                              std::string_view fqn,
                                              bool check_crc);

// The same for an item held in memory (the daemon's writer gathers the
// bytes of a bytes item as it streams them): INVALID_ARGUMENT "bytes item
// 'FQN' (N bytes) is not a torch.save archive: WHY". Items larger than
// kMaxBytesItemParse are checked for their zip framing only (`data` then
// holds their first 64 KiB).
inline constexpr uint64_t kMaxBytesItemParse = uint64_t{256} << 20;
inline constexpr uint64_t kBytesItemFramingPrefix = uint64_t{64} << 10;
absl::Status CheckBytesItemInMemory(std::string_view fqn, std::string data,
                                    uint64_t nbytes);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_TENSOR_BYTES_ITEM_H_
