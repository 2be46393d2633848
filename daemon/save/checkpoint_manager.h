// Copyright 2026 The ckptd Authors.
//
// CheckpointManager: the daemon's orchestrator, free of gRPC. It moves each
// save through the stages, one folder each, handing them plain structs
// (save_types.h); only it changes a checkpoint's state, fails it, schedules
// tasks and answers callers:
//
//   Save(SaveBatch)          from service/ (the gRPC service decodes it)
//     │
//     ▼
//   staging/                 save_validator: the rank's index and the
//     │                      batch's extents, bounds-checked → RankIndex,
//     │                      ValidatedBatch; arena_registry, staging_pool:
//     │                      extents adopted against the staging budget
//     │                      (backpressure); gpu_stager for CUDA buffers;
//     │                      the rank's last batch adopted → "staged" reply
//     ▼
//   plan/                    node_planner, once every local rank's index is
//     │                      in → WritePlan (multi-node: the coordinator's
//     │                      plan round, cluster/participant)
//     ▼
//   write/                   rank_writer per rank, in index order: each
//     │                      surviving item streamed as a torch.save archive
//     │                      into __{rank}_0.distcp → RankWriteResult;
//     │                      consumed bytes release budget and arena pages
//     ▼
//   commit/                  journal (step 0), committer (steps 1, 3–6),
//                            retention; recovery at start-up
//                            (docs/durability.md numbers the steps)
//
// Multi-node (SaveBatch.cluster): the node sends its index to the
// coordinator (cluster/) and writes what the global plan gives its ranks;
// it then sends where its items landed (Prepare) and the coordinator
// publishes .metadata. A heartbeat carries progress both ways.
//
// States: PENDING → STAGING → WRITING → COMMITTING → COMMITTED, or FAILED /
// CANCELLED from any non-final state (files removed, memory released).
//
// Files (daemon/save/, each part a header and its .cc, in the order one save
// passes them; only this header is used outside the folder):
//   checkpoint_manager   this facade: the public API, the queries, Cancel,
//                        Wait, the arenas
//   intake               Save calls validated and adopted into an attempt
//                        (staging/)
//   tasks                the plan, write and commit tasks on the I/O pool
//                        (plan/, write/, commit/), directory ownership,
//                        retention after a commit
//   attempt              the record of one attempt, its tasks' accounting,
//                        failure, commit, cleanup, deadlines
//   cluster_link         the node side of multi-node checkpoints (cluster/)
//   external_commit      DCP's StorageWriter: the `.metadata` DCP hands in
//   save_core            what the parts share (the one mutex, the pool,
//                        options, the attempts), start-up, shutdown, timers
//
// Thread-safety: all public methods are thread-safe and never block on I/O;
// callbacks run exactly once, on the calling thread or a daemon thread,
// never with the manager's lock held.
#ifndef CKPTD_DAEMON_SAVE_CHECKPOINT_MANAGER_H_
#define CKPTD_DAEMON_SAVE_CHECKPOINT_MANAGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "daemon/cluster/cluster.h"
#include "daemon/commit/recovery.h"
#include "daemon/options.h"
#include "daemon/types/checkpoint_state.h"
#include "daemon/types/save_types.h"
#include "shm/fd_passing.h"

namespace ckptd::daemon {

struct Arena;      // arena/arena_registry.h
class MemoryTier;  // tier/memory_tier.h
class Shares;      // cluster/shares.h
namespace save {
struct SaveCore;  // save_core.h
}  // namespace save

// The GPU path as the daemon runs it (GetInfo).
struct CudaInfo {
  bool available = false;          // device extents are accepted
  std::string unavailable_reason;  // otherwise: why not
  uint64_t pinned_bytes = 0;       // the pinned staging pool
  uint64_t pinned_in_use = 0;
  std::vector<std::string> devices;  // PCI bus ids
};

// Checkpoint events, for metrics (DaemonOptions::observer). Called with the
// manager's lock held: implementations must be quick, thread-safe and must
// not call into the manager.
class CheckpointObserver {
 public:
  virtual ~CheckpointObserver() = default;
  // A checkpoint reached COMMITTED, FAILED or CANCELLED (once each).
  virtual void CheckpointFinished(const CheckpointInfo& info) = 0;
  // A Save call was rejected before its checkpoint took it (bad input,
  // limits); failures of a checkpoint come through CheckpointFinished.
  virtual void SaveRejected(const absl::Status& error) = 0;
};

class CheckpointManager {
 public:
  // Recovers unfinished checkpoints from options.state_dir's journal, then
  // starts the writer threads. `options` must have been finalized
  // (FinalizeOptions); options.env must be set.
  static absl::StatusOr<std::unique_ptr<CheckpointManager>> Create(
      const DaemonOptions& options);
  // Aborts unfinished checkpoints (their files are removed) and joins the
  // threads.
  ~CheckpointManager();
  // The first half of the destructor, for a daemon that shuts down: from
  // now on saves are refused (UNAVAILABLE), and every unfinished checkpoint
  // that is not committing fails with `why`, so the callers still waiting
  // on them (Save, Wait, WaitArenaIdle) are answered with it while the
  // service can still reply. Commits in progress finish; their waiters get
  // the outcome. Idempotent; the destructor does the rest.
  void BeginShutdown(const absl::Status& why);

  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  const DaemonOptions& options() const;
  const RecoveryReport& recovery() const;

  // Arenas by name (shm/mapping.h): opened in options.shm_dir and unlinked.
  // For in-process callers (tests, tools) and the legacy gRPC RegisterArena
  // (refused there unless options.allow_named_arenas: the daemon would read
  // any file it can open, whoever asked). `client_pid` is the caller's own
  // claim; the log line pairs it with the arena file's owner uid (set by the
  // kernel) and with /proc/<pid>'s uid. The arena counts against the file
  // owner's per-uid quota.
  absl::StatusOr<uint64_t> RegisterArena(std::string_view name, uint64_t size,
                                         std::string_view owner,
                                         int64_t client_pid = 0);
  // Arenas passed as descriptors over the arena socket (arena_listener.h):
  // takes `fd` (closed on failure too), which must be a memfd sealed against
  // shrinking and at least `size` bytes (shm::Mapping::FromFd), so nothing
  // the client does later can make the daemon fault. `peer` is the
  // connection's SO_PEERCRED: the arena belongs to peer.uid (ArenaEntry::uid,
  // verified_uid) and counts against its quota. Beyond max_arenas,
  // max_arenas_per_client or max_arena_bytes_per_client: RESOURCE_EXHAUSTED
  // naming the uid and the limit.
  absl::StatusOr<uint64_t> RegisterArenaFd(int fd, uint64_t size,
                                           std::string_view owner,
                                           const shm::PeerCredentials& peer);
  // Unmaps the arena once no checkpoint holds bytes of it.
  absl::Status ReleaseArena(uint64_t arena_id);
  // The registered arena `arena_id` (nullptr if unknown or expired), for
  // restores (restore/), which write into it; counts as a use of it.
  std::shared_ptr<const Arena> FindArena(uint64_t arena_id);
  // `done` runs when no checkpoint holds bytes of the arena, or with
  // DEADLINE_EXCEEDED at `deadline`. Returns a token for ForgetCall.
  uint64_t WaitArenaIdle(uint64_t arena_id, absl::Time deadline,
                         DoneCallback done);

  // Handles one Save call (see daemon.proto). `done` gets the reply or a
  // precise error. Returns a token for CallerGone.
  uint64_t Save(SaveBatch batch, SaveCallback done);

  // The client of call `token` went away. For a Save whose rank is not yet
  // staged, the checkpoint is aborted. For waits, the waiter is dropped
  // (its callback runs with CANCELLED).
  void CallerGone(uint64_t token);

  absl::StatusOr<CheckpointInfo> GetStatus(std::string_view checkpoint_id);
  // Known checkpoints (oldest first), optionally of one job; include_disk
  // adds committed checkpoints recorded by earlier daemon runs.
  std::vector<CheckpointInfo> List(std::string_view job, bool include_disk);
  // Cancels an unfinished checkpoint; FAILED_PRECONDITION if it finished.
  absl::StatusOr<State> Cancel(std::string_view checkpoint_id,
                               std::string_view reason);
  // `done` runs when the checkpoint is final (or, with until_data_durable,
  // an external_metadata checkpoint's data is durable), or with
  // DEADLINE_EXCEEDED at `deadline`. Returns a token for CallerGone.
  uint64_t Wait(std::string_view checkpoint_id, absl::Time deadline,
                InfoCallback done, bool until_data_durable = false);
  // DCP's StorageWriter (daemon.proto GetLayout / CommitMetadata): where an
  // external_metadata checkpoint's items were written, and the `.metadata`
  // to check and publish. The caller's arena names its uid, which must be
  // the saver's (PERMISSION_DENIED).
  absl::StatusOr<Layout> GetLayout(std::string_view checkpoint_id,
                                   uint64_t arena_id);
  absl::Status CommitMetadata(std::string_view checkpoint_id, uint64_t arena_id,
                              std::string metadata);

  // One pass of the daemon's timers (stage_timeout, batch_gap_timeout,
  // peer timeouts, Wait deadlines, idle arenas) at `now` of the injected
  // clock. A housekeeping thread runs it every 100 ms; tests on a
  // SimulatedClock advance the clock and call it.
  void TickForTest(absl::Time now);

  // Bytes of arenas currently held by checkpoints (<= staging_budget).
  uint64_t staged_bytes_in_use() const;
  // Arenas currently registered (<= max_arenas).
  int arenas_registered() const;

  // The GPU path: whether device extents are accepted, the pinned pool.
  CudaInfo cuda_info() const;
  // The memory tier (memory_tier_bytes): the restorer reads what it holds.
  // Lives as long as the manager.
  MemoryTier* memory_tier();

  // The coordinator of the multi-node checkpoints whose rank 0 is on this
  // node; the peer service hands it the other nodes' calls.
  CoordinatorLink* coordinator();
  // Peer replicas and other daemons' memory (null without a peer service):
  // for the peer service and the restorer.
  Shares* shares();

 private:
  explicit CheckpointManager(std::unique_ptr<save::SaveCore> core);
  // What the parts of daemon/save/ share (save_core.h).
  std::unique_ptr<save::SaveCore> core_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_SAVE_CHECKPOINT_MANAGER_H_
