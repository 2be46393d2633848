// Copyright 2026 The ckptd Authors.
//
// The record of one checkpoint attempt (Checkpoint, one RankState per
// rank), what queries show of it, and the transitions that end it: failure
// or cancel, commit, and the cleanup of a failed attempt's files. An
// attempt is made by intake (a rank's first batch), planned, written and
// committed by tasks (or cluster_link, multi-node), and kept, compacted,
// for queries once settled:
//
//   PENDING → STAGING → WRITING → COMMITTING → COMMITTED
//   any non-final state → FAILED / CANCELLED (FailLocked)
//
// Locking: every field of a Checkpoint is guarded by SaveCore::mu, except
// those marked "task-owned" (only the task holding the rank's `busy` flag,
// or the plan task before `dir_ready`, touches them) and the atomics.
#ifndef CKPTD_DAEMON_SAVE_ATTEMPT_H_
#define CKPTD_DAEMON_SAVE_ATTEMPT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/tasks.h"
#include "daemon/cluster/participant.h"
#include "daemon/commit/checkpoint_dir.h"
#include "daemon/save/save_core.h"
#include "daemon/tier/memory_tier.h"
#include "daemon/types/checkpoint_state.h"
#include "daemon/types/save_types.h"
#include "daemon/write/rank_writer.h"

namespace ckptd::daemon::save {

// Checkpoint::uid of a checkpoint saved by ranks of several users.
inline constexpr int64_t kMixedUid = -2;

struct RankState {
  bool indexed = false;
  RankIndex index;
  // Arrival (validation of extent order).
  uint32_t next_sequence = 0;
  ExtentCursor cursor;
  uint64_t received = 0;  // bytes named by validated batches
  bool last_received = false;
  uint64_t adopted = 0;  // bytes adopted against the budget
  bool staged = false;
  std::deque<StagedExtent> queue;  // adopted, not yet consumed by the writer
  uint64_t consumed = 0;
  // A non-last batch's reply, sent when consumed >= consume_target.
  uint64_t consume_target = 0;
  uint64_t consume_token = 0;
  SaveCallback consume_done;
  uint64_t call_token = 0;  // the Save call in flight for this rank, 0: none
  // When the reply to a non-last batch went out (the client now owes the
  // next batch); InfinitePast while a call is in flight or after the last.
  absl::Time awaiting_next_since = absl::InfinitePast();
  bool busy = false;                   // a writer task owns `writer`
  bool done = false;                   // file written, fsynced and closed
  std::unique_ptr<RankWriter> writer;  // task-owned; made when planned
};

struct Checkpoint {
  uint64_t seq = 0;
  std::string dir;
  std::string job;
  // The Unix user whose arenas hold the checkpoint's bytes (kUnknownUid
  // until a host batch arrives; kMixedUid if ranks of several users saved
  // into it: then retention prunes nothing for it).
  int64_t uid = kUnknownUid;
  int world_size = 0;
  bool overwrite = false;
  bool dedup_lowest = false;
  int keep_last_n = 0;  // 0: options.keep_last_n
  int64_t keep_every = 0;
  int zstd_level = 0;  // 0: payloads uncompressed
  // The ranks saving through this daemon: all of them (single-node), or
  // this node's (cluster.num_nodes > 1).
  ClusterSpec cluster;
  std::vector<int> local;
  int num_local = 0;
  bool multi = false;
  bool is_coordinator = false;
  std::optional<ParticipantState> node;  // multi-node only
  State state = State::kPending;
  absl::Status error;
  absl::Time created, staged = absl::InfinitePast(),
                      finished = absl::InfinitePast();
  absl::Time last_progress;
  std::vector<RankState> ranks;
  int ranks_indexed = 0;
  int ranks_staged = 0;
  int ranks_done = 0;
  uint64_t total_bytes = 0, staged_bytes = 0, written_bytes = 0;
  // Payload bytes appended so far, updated by writers piece by piece (for
  // progress); written_bytes is exact file bytes once a rank's work is done.
  std::atomic<uint64_t> written_live{0};
  bool planned = false;
  bool dir_ready = false;  // step 1 done
  bool created_dir = false;
  // Step 1 opens the directory beneath its root without following
  // symlinks; every later step goes through io_dir, anchored to its fd.
  std::unique_ptr<CheckpointDir> dirh;
  std::string io_dir;
  std::string journal_path;
  // The memory tier's copy of the files this node writes (null: tier off);
  // handed to the tier at commit, dropped with the rank state otherwise.
  std::shared_ptr<TierCapture> tier_capture;
  WritePlan plan;
  std::vector<format::StorageInfo> infos;  // per plan item, as ranks finish
  int busy_tasks = 0;                      // plan / writer / commit tasks
  bool cleaned = false;
  // Directory ownership (SaveCore::dirs): only the attempt that owns `dir`
  // touches files in it. Set when its plan is submitted; given back when
  // the attempt is committed, or failed and its files removed.
  bool owns_dir = false;
  bool cleanup_running = false;  // RunCleanup submitted, not yet finished
  // DCP's StorageWriter (SaveOptions.external_metadata): once the data is
  // durable the attempt waits up to metadata_timeout (from
  // awaiting_metadata_since) for the `.metadata` DCP's coordinator hands
  // StorageWriter.finish (CommitMetadata: external_bytes), then RunCommit
  // checks it against what was written and publishes it as given.
  bool external_metadata = false;
  absl::Duration metadata_timeout;
  absl::Time awaiting_metadata_since = absl::InfinitePast();
  std::string external_bytes;
  // Settled (final, no task, files dealt with): the per-rank state, plan and
  // storage infos are dropped; what queries show is kept in these.
  bool compacted = false;
  uint64_t items_total = 0;
  uint32_t files_total = 0;
  // Set with the final state on failure/cancel: writers stop between pieces.
  std::atomic<bool> aborted{false};
  struct Waiter {
    uint64_t token;
    absl::Time deadline;
    InfoCallback done;
    bool until_data_durable = false;  // answered when awaiting metadata too
  };
  std::vector<Waiter> waiters;

  // The local ranks' indexes, parallel to `local`.
  std::vector<const RankIndex*> LocalIndexes() const;
  // Every rank's index (single-node: all ranks are local).
  std::vector<const RankIndex*> AllIndexes() const;
};

namespace attempt {

// What Status, List and Wait show of `c`.
CheckpointInfo InfoOf(const Checkpoint& c);
// Drops what a settled checkpoint no longer needs: a finished checkpoint
// costs a few hundred bytes, whatever its world size and item count.
void Compact(Checkpoint& c);

// Runs `t` on the I/O pool as one of c's tasks (busy_tasks); the task ends
// with TaskEndLocked or TaskEnd. Dropped after Shutdown joined the pool.
void SubmitLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c, Task t)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// Every task submitted for `c` calls this exactly once, at its end; the
// last one out of a final checkpoint settles its directory.
void TaskEndLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                   Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
void TaskEnd(SaveCore& core, const std::shared_ptr<Checkpoint>& c)
    ABSL_LOCKS_EXCLUDED(core.mu);

// `c` reached a final state: the observer is told and its waiters are
// answered (after the lock).
void FinishLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                  Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// `c` ends in `state` (FAILED or CANCELLED) with `error`, unless it is final
// already: writers stop, the batches and bytes it holds are given back and
// its callers answered, its files removed once no task runs for it, and a
// multi-node checkpoint is aborted at its coordinator.
void FailLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                absl::Status error, State state, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// `c` is COMMITTED: it gives its directory back (a retry or retention may
// take it at once) and its waiters are answered.
void CommittedLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

// Once `c` is final and no task runs for it: a committed one (or one whose
// files are deliberately kept) gives its directory back at once; a failed
// or cancelled one that owned it removes its files first (RunCleanup, on
// the pool, after the lock is released), then gives it back. An attempt
// that never owned its directory touched nothing on disk.
void MaybeCleanupLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                        Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// Removes a failed attempt's data files, `.metadata.tmp` and journal entry.
// No task runs for `c` any more (busy_tasks == 0, cleanup_running).
void RunCleanup(SaveCore& core, const std::shared_ptr<Checkpoint>& c);

// The deadlines of unfinished `c` at `now`: stage_timeout, the heartbeat
// of a multi-node checkpoint, metadata_timeout, batch_gap_timeout, and its
// waiters' deadlines.
void TickLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                absl::Time now, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

}  // namespace attempt
}  // namespace ckptd::daemon::save

#endif  // CKPTD_DAEMON_SAVE_ATTEMPT_H_
