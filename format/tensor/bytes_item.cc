// Copyright 2026 The ckptd Authors.
#include "format/tensor/bytes_item.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/verify.h"
#include "format/tensor/tensor_payload.h"

namespace ckptd::format {

absl::StatusOr<BytesItemCheck> CheckBytesItem(const ZipArchiveReader& archive,
                                              std::string_view fqn,
                                              bool check_crc) {
  BytesItemCheck out;
  if (check_crc) {
    for (const ZipEntry& e : archive.entries()) {
      RETURN_IF_ERROR(archive.VerifyCrc(e));
      out.crc_bytes += e.size;
    }
  }
  // Every GLOBAL / STACK_GLOBAL / INST, reachable or not.
  ASSIGN_OR_RETURN(
      std::unique_ptr<pickle::PickleDocument> doc,
      ParseArchivePickle(archive, uint64_t{1} << 30, std::string(fqn)));
  absl::flat_hash_set<std::string> seen;
  for (const pickle::Value* g : doc->globals()) {
    if (IsAllowedPickleGlobal(g->module, g->name)) continue;
    std::string full = g->module + "." + g->name;
    if (seen.insert(full).second) out.unsafe_globals.push_back(std::move(full));
  }
  return out;
}

absl::Status CheckBytesItemInMemory(std::string_view fqn, std::string data,
                                    uint64_t nbytes) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(fmt::format(
        "bytes item '{}' ({} bytes) is not a torch.save archive: {}", fqn,
        nbytes, std::string_view(why.data(), why.size())));
  };
  if (nbytes > kMaxBytesItemParse) {
    if (!std::string_view(data).starts_with("PK\x03\x04")) {
      return bad("no zip local header at its start");
    }
    return absl::OkStatus();
  }
  InMemoryFile file(std::move(data), std::string(fqn));
  absl::StatusOr<std::unique_ptr<ZipArchiveReader>> archive =
      ZipArchiveReader::Open(&file, 0, file.Size());
  if (!archive.ok()) return bad(archive.status().message());
  if (absl::StatusOr<BytesItemCheck> c =
          CheckBytesItem(**archive, fqn, /*check_crc=*/true);
      !c.ok()) {
    return bad(c.status().message());
  }
  return absl::OkStatus();
}

}  // namespace ckptd::format
