// Copyright 2026 The ckptd Authors.
//
// The plain structs of a restore through the daemon (docs/restore.md), in
// data-flow order:
//
//   RestoreBatch       one rank's Restore call, decoded by service/ and
//     │                checked against its arena by the restorer
//     ▼
//   restore_groups     gathers batch k of every local rank of a group
//     │                → GroupBatch (the members, each with its arena)
//     ▼
//   checkpoint_cache   the decoded .metadata of the checkpoint, once per
//     │                node → CachedCheckpoint
//     ▼
//   batch_reader       reads each needed byte range once for the group and
//                      copies into every member's arena → RestoreReply each
#ifndef CKPTD_DAEMON_RESTORE_RESTORE_TYPES_H_
#define CKPTD_DAEMON_RESTORE_RESTORE_TYPES_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "format/tensor/dtype.h"

namespace ckptd::daemon {

struct Arena;  // staging/arena_registry.h

// A copy of `s` with a representation of its own. One error goes to many
// callers (every rank of a group batch), each answered and destroyed on its
// own thread; Debian's absl drops references to a shared status partly in
// code ThreadSanitizer cannot see, so each caller gets its own copy.
inline absl::Status OwnStatus(const absl::Status& s) {
  return s.ok() ? absl::OkStatus() : absl::Status(s.code(), s.message());
}

// A box of a saved tensor, wanted C-contiguous at arena_offset.
struct RestoreBox {
  std::string fqn;
  std::vector<int64_t> offsets;  // global offsets (empty for a 0-d tensor)
  std::vector<int64_t> sizes;
  format::DType dtype = format::DType::kFloat32;
  uint64_t arena_offset = 0;
  uint64_t nbytes = 0;  // numel(sizes) * element size (set by the decoder)
};

// A bytes item, wanted at [arena_offset, arena_offset + capacity).
struct RestoreBytes {
  std::string fqn;
  uint64_t arena_offset = 0;
  uint64_t capacity = 0;
};

// One Restore call (daemon.proto RestoreRequest), syntax-checked.
struct RestoreBatch {
  std::string checkpoint_id;  // as sent; the restorer resolves it
  std::string group;          // empty: the rank alone
  int local_rank = 0;
  int local_world_size = 1;
  uint32_t batch = 0;
  bool last = false;
  uint64_t arena_id = 0;
  std::vector<RestoreBox> boxes;
  std::vector<RestoreBytes> bytes_items;
  bool verify_crc = true;
  std::string identity;  // of .metadata, from GetRestoreIndex; empty: any
  bool accept_group_buffer = false;  // boxes may come in a group buffer
  bool accept_held_buffers = false;  // boxes may come in lent tier memory
};

// The answer to one Restore call.
struct RestoreReply {
  std::vector<uint64_t> bytes_lengths;  // per bytes item, in request order
  uint64_t storage_bytes = 0;  // payload bytes read for the group's batch
  // Of them, fetched from other daemons' memory (peer_env.h): what the
  // checkpoint's peer counter grew by while the batch was read.
  uint64_t peer_bytes = 0;
  uint64_t copied_bytes = 0;  // bytes written into this rank's arena
  int group_ranks = 1;        // ranks served together
  // Boxes in a group buffer (group_buffers.h) instead of the arena: its
  // token and size, and where each box of the request starts in it.
  std::string group_buffer_token;
  uint64_t group_buffer_size = 0;
  std::vector<uint64_t> box_buffer_offsets;
  // Boxes in files the memory tier holds, lent in place (accept_held_buffers;
  // group_buffers.h Lend): each file's token and size, and for every box of
  // the request which of them holds it at box_buffer_offsets (0: none, the
  // box is in the group buffer or the arena as above; i: held_buffers[i-1]).
  // Both empty when no box is lent.
  struct Held {
    std::string token;
    uint64_t size = 0;
  };
  std::vector<Held> held_buffers;
  std::vector<uint32_t> box_buffers;
};
using RestoreCallback = absl::AnyInvocable<void(absl::StatusOr<RestoreReply>)>;

// The index a rank plans its boxes with (GetRestoreIndex).
struct RestoreIndex {
  std::string checkpoint_id;  // resolved absolute directory
  std::shared_ptr<const std::string> index_json;
  std::string identity;
};
using IndexCallback = absl::AnyInvocable<void(absl::StatusOr<RestoreIndex>)>;

// A member of a group batch: its request, its arena (kept mapped while the
// batch is served) and where its answer goes.
struct GroupMember {
  RestoreBatch batch;
  std::shared_ptr<const Arena> arena;
  RestoreCallback done;
};

// What identifies one restore: (caller uid, checkpoint directory, group
// string). restore_groups gathers by it, restore_progress reports by it.
using RestoreKey = std::tuple<uint32_t, std::string, std::string>;

// Batch k of the ranks of one group that came within the gather timeout.
struct GroupBatch {
  std::string dir;  // resolved checkpoint directory
  uint32_t caller_uid = 0;
  std::vector<GroupMember> members;
};

// How long a restore may go without a batch before it is given up: its
// group forgotten (restore_groups), its progress ABANDONED
// (restore_progress). Six gather timeouts, at least a minute.
inline absl::Duration RestoreIdleTimeout(absl::Duration gather_timeout) {
  return std::max(absl::Minutes(1), 6 * gather_timeout);
}

// The restore a group batch belongs to.
inline RestoreKey KeyOf(const GroupBatch& g) {
  return RestoreKey{g.caller_uid, g.dir,
                    g.members.empty() ? "" : g.members[0].batch.group};
}

// Restore events, for metrics (RestorerOptions::observer). Called from
// restore threads without locks held; implementations must be quick and
// thread-safe.
class RestoreObserver {
 public:
  virtual ~RestoreObserver() = default;
  // A group batch was read: `ranks` served together, `storage_bytes` of
  // payload read for all of them.
  virtual void RestoreBatchRead(int ranks, uint64_t storage_bytes) = 0;
  // A Restore call was answered with `code`, `copied_bytes` into its arena.
  virtual void RestoreAnswered(absl::StatusCode code,
                               uint64_t copied_bytes) = 0;
  // `bytes` were read from a checkpoint's data files on storage (reads and
  // CRC checks; not what the memory tier served): counting_env.h.
  virtual void RestoreFileBytesRead(uint64_t bytes) { (void)bytes; }
  // `bytes` were fetched from other daemons' memory (peer_env.h).
  virtual void RestorePeerBytesRead(uint64_t bytes) { (void)bytes; }
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_RESTORE_TYPES_H_
