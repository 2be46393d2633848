// Copyright 2026 The ckptd Authors.
//
// Restoring from other daemons' memory (peer_replicas, docs/restore.md
// "Peer replicas"): an Env whose data files of one checkpoint are read from
// the daemons that hold them (ShareSource), not from storage:
//   - a file gone from storage (a replaced node's local disk) is read only
//     from its holders; if none answers, DATA_LOSS naming the file and the
//     holders tried;
//   - a file still on storage is read from a holder too unless
//     `only_missing`, while its storage copy has the identity the holder
//     recorded; a holder that fails (gone, CRC mismatch, evicted) hands the
//     file over to storage, said once per file.
// Below the memory tier's Env (what this node holds itself comes first)
// and beside the counting Env: bytes from peers are counted apart
// (RestoreObserver::RestorePeerBytesRead and `peer_bytes`).
#ifndef CKPTD_DAEMON_RESTORE_PEER_ENV_H_
#define CKPTD_DAEMON_RESTORE_PEER_ENV_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "daemon/restore/restore_types.h"
#include "daemon/tier/share_source.h"

namespace ckptd::daemon {

struct PeerEnvOptions {
  ShareSource* source = nullptr;  // not owned
  std::string dir;                // the checkpoint's absolute directory
  std::string metadata;           // its .metadata's PortableIdentity
  std::vector<PeerHeldFile> files;
  bool only_missing = false;            // peer_restore=missing
  RestoreObserver* observer = nullptr;  // may be null
  // Counts the bytes fetched (may be null; must outlive the Env).
  std::atomic<uint64_t>* fetched = nullptr;
};

std::unique_ptr<Env> NewPeerEnv(Env* base, PeerEnvOptions options);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_PEER_ENV_H_
