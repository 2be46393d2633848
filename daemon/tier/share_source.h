// Copyright 2026 The ckptd Authors.
//
// ShareSource: the data files of a checkpoint that other daemons hold in
// their memory tiers (their own files, or replicas: peer_replicas), as a
// restore sees them. Implemented over the peer service (cluster/shares.h);
// the restore path reads through it (restore/peer_env.h) without knowing
// gRPC. Implementations are thread-safe and block (restore threads only).
#ifndef CKPTD_DAEMON_TIER_SHARE_SOURCE_H_
#define CKPTD_DAEMON_TIER_SHARE_SOURCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ckptd::daemon {

// One data file of a checkpoint held in other daemons' memory.
struct PeerHeldFile {
  std::string file;  // relative path in the checkpoint directory
  uint64_t size = 0;
  std::string identity;  // its PortableIdentity at commit
  // Peer addresses of the daemons holding it, in the order to try them.
  std::vector<std::string> holders;
};

class ShareSource {
 public:
  virtual ~ShareSource() = default;
  // The files of checkpoint `dir` (an absolute directory, the same path on
  // every node) whose .metadata has PortableIdentity `metadata` that the
  // daemons this one knows of hold; those that do not answer within a few
  // seconds are left out (logged).
  virtual std::vector<PeerHeldFile> Locate(const std::string& dir,
                                           const std::string& metadata) = 0;
  // Copies [offset, offset + n) of `file` from `holder`'s memory into
  // `dst`, each piece CRC-checked on arrival (DATA_LOSS on a mismatch;
  // NOT_FOUND once the holder no longer holds it; UNAVAILABLE /
  // DEADLINE_EXCEEDED for a holder gone).
  virtual absl::Status Fetch(const std::string& holder, const std::string& dir,
                             const std::string& metadata,
                             const std::string& file, uint64_t offset,
                             uint64_t n, char* dst) = 0;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_TIER_SHARE_SOURCE_H_
