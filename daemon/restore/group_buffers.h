// Copyright 2026 The ckptd Authors.
//
// Group buffers: how the ranks of a group batch get the values the daemon
// read once for all of them, without the daemon copying them into every
// rank's arena. The daemon reads the batch's distinct boxes into one memfd
// (a shm::Arena of its own, sealed against resizing), publishes it under a
// random 128-bit token and tells each rank the token and where its boxes
// lie (RestoreResponse.group_buffer_token, box_buffer_offsets). Each rank
// fetches a READ-ONLY descriptor of it over the arena socket
// (shm::FetchGroupBuffer: the connection's SO_PEERCRED uid must be the
// group's), maps it and copies its boxes straight into its tensors: one
// copy per rank, as from the page cache.
//
//   Create(size, group)          the group's buffer of its previous batch
//                                when large enough (see below), else a
//                                new one; RESOURCE_EXHAUSTED when the
//                                buffers alive would exceed max_bytes (the
//                                batch is then served through the arenas)
//   Publish(buffer, ..., n)      the token; fetchable n times
//   Lend(memory, group, n)       a token for memory of another owner
//                                (the memory tier's held files),
//                                fetchable n times
//   Fetch(token, uid)            a read-only fd (O_RDONLY reopen of the
//                                memfd) and the size
//   Expire(now)                  buffers older than `ttl` are dropped (a
//                                rank that died never fetches)
//
// Reuse: a rank sends batch k+2 only after copying its boxes of batch k out
// of its buffer (the client may send batch k+1 before copying batch k, so
// that the daemon reads k+1 while the ranks copy k), so when batch k+2 is
// served, batch k's buffer is free: it is taken over (its token forgotten:
// a fetch that comes that late is NOT_FOUND) and read into again. A group
// thus alternates between two buffers. Fresh memory costs a page clear per
// page (as much as the copy itself on the build VM); a restore of many
// batches pays it twice. A group's buffers are dropped when every rank
// fetched its final batch, or at `ttl`.
//
// A rank's mapping keeps the memory alive after the daemon dropped it; the
// client keeps the group's two buffers mapped until its restore ends (a
// reused buffer is recognised by its inode and not mapped again).
//
// Thread-safe: Fetch runs on the arena listener's thread (no blocking: a
// mutex, an open(2) of /proc/self/fd); Create, Publish and Expire on
// restore threads.
#ifndef CKPTD_DAEMON_RESTORE_GROUP_BUFFERS_H_
#define CKPTD_DAEMON_RESTORE_GROUP_BUFFERS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/restore/restore_types.h"
#include "shm/arena.h"
#include "shm/fd_passing.h"

namespace ckptd::daemon {

struct GroupBuffersOptions {
  // Bytes of group buffers alive at once (restore_buffer_bytes).
  uint64_t max_bytes = uint64_t{2} << 30;
  // How long a published buffer waits for its fetches.
  absl::Duration ttl = absl::Seconds(60);
};

// A buffer being filled (Create), then handed to Publish.
struct FilledBuffer {
  std::shared_ptr<shm::Arena> memory;
};

// Memory of another owner lent to the ranks of a batch (a held file of the
// memory tier, memory_tier.h): fetched read-only like a group buffer, but
// never taken over or written, and not counted in max_bytes.
struct LentMemory {
  int fd = -1;  // a memfd sealed against writing
  uint64_t size = 0;
  std::shared_ptr<const void> owner;  // keeps `fd` open while lent
};

class GroupBuffers {
 public:
  explicit GroupBuffers(GroupBuffersOptions options) : options_(options) {}

  absl::StatusOr<FilledBuffer> Create(uint64_t size, const RestoreKey& group);
  // A buffer Create made but nobody will fetch (its read failed).
  void Discard(FilledBuffer buffer);
  // `final`: the group's last batch (dropped after its last fetch).
  std::string Publish(FilledBuffer buffer, const RestoreKey& group, int fetches,
                      bool final, absl::Time now);
  // Lends `memory` to `fetches` ranks of `group`: the token, forgotten
  // after the last fetch or at ttl (a rank's mapping outlives both).
  std::string Lend(LentMemory memory, const RestoreKey& group, int fetches,
                   absl::Time now);
  // A published or lent token. NOT_FOUND for an unknown or expired token,
  // PERMISSION_DENIED for another uid (uid 0 may fetch any).
  absl::StatusOr<shm::FetchedFd> Fetch(const std::string& token, uint32_t uid);
  void Expire(absl::Time now);

  uint64_t bytes_alive() const;
  size_t published() const;

 private:
  struct Published {
    std::shared_ptr<shm::Arena> memory;
    RestoreKey group;  // uid first
    int fetches_left = 0;
    bool final = false;
    absl::Time created;
  };
  // Takes the group's buffer of two batches ago out of published_ (nullptr
  // if none).
  std::shared_ptr<shm::Arena> TakePrevious(const RestoreKey& group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets every buffer of `group`, moving their memory to `out` (to be
  // unmapped after the lock).
  void DropGroup(const RestoreKey& group,
                 std::vector<std::shared_ptr<shm::Arena>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Lent {
    LentMemory memory;
    RestoreKey group;
    int fetches_left = 0;
    absl::Time created;
  };

  const GroupBuffersOptions options_;
  mutable absl::Mutex mu_;
  uint64_t bytes_alive_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, Published> published_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Lent> lent_ ABSL_GUARDED_BY(mu_);
  // Tokens of each group's last two batches, oldest first.
  std::map<RestoreKey, std::deque<std::string>> latest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_GROUP_BUFFERS_H_
