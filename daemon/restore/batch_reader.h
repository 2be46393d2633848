// Copyright 2026 The ckptd Authors.
//
// Serves one group batch (restore_groups.h) from a decoded checkpoint
// (checkpoint_cache.h): each distinct box (fqn, offsets, sizes) the members
// want is read once — straight into the arena of the first member that
// wants it, by the checkpoint's CheckpointReader (resharding, CRC rule of
// checkpoint_reader.h) — and copied from there into the arenas of the
// others; or, when several ranks take part and all accept it, read once
// into a group buffer (group_buffers.h) from which each rank copies its
// boxes itself (no copy by the daemon); each bytes item is read once and copied
// into every arena that wants it. A member's own mistakes (a range outside its
// arena, an unknown fqn, a box outside the tensor, a dtype that differs from
// the saved one, a bytes item larger than its slot) fail only that member; a
// read error (DATA_LOSS naming file, item and offset) fails every member the
// read served. CRC-32s are checked (the rule of checkpoint_reader.h) unless
// every member asked to skip them. The payload bytes read are reported on
// the first member served (RestoreReply.storage_bytes; 0 on the others), so
// the ranks' figures add up to what the node read.
//
// Takes: GroupBatch (its members' callbacks are not run here) and the
// CachedCheckpoint. Hands on: one StatusOr<RestoreReply> per member.
#ifndef CKPTD_DAEMON_RESTORE_BATCH_READER_H_
#define CKPTD_DAEMON_RESTORE_BATCH_READER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancel.h"
#include "daemon/restore/checkpoint_cache.h"
#include "daemon/restore/group_buffers.h"
#include "daemon/restore/restore_types.h"

namespace ckptd::daemon {

// Results in the order of group.members. `results` must hold one entry per
// member on entry: an error there (identity, permission) excludes the
// member and is kept. `buffers` (may be null): where a group buffer comes
// from, published at `now`. `cancel` (may be null): once raised, the reads
// stop at their next saved chunk (or block of a large record) and every
// member still served is answered with its status (CANCELLED).
void ServeGroupBatch(const CachedCheckpoint& ckpt, const GroupBatch& group,
                     GroupBuffers* buffers, absl::Time now,
                     const Cancellation* cancel,
                     std::vector<absl::StatusOr<RestoreReply>>* results);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_BATCH_READER_H_
