// Copyright 2026 The ckptd Authors.
//
// CheckpointManager: the daemon's core, free of gRPC. One save flows through
// it top to bottom:
//
//   Save(SaveBatch)          a rank's index (sequence 0) and byte ranges of
//     │                      its shared-memory arena, validated here
//     ▼
//   staging                  extents adopted against the staging budget
//     │                      (backpressure: a batch waits for room); the
//     │                      rank's last batch adopted → "staged" reply
//     ▼
//   planner                  once every rank's index is in: PlanSave (dedup,
//     │                      file assignment), then step 0 of the commit
//     ▼
//   writer                   per rank, in index order: each surviving item
//     │                      streamed as a torch.save archive into
//     │                      __{rank}_0.distcp (io_uring or pwrite Env);
//     │                      consumed bytes release budget and arena pages
//     ▼
//   commit                   steps 1–6 in checkpoint_manager.cc; retention
//
// Multi-node (SaveBatch.cluster): the planner step sends the node's index to
// the coordinator (cluster.h) and writes what the global plan gives its
// ranks; the commit step sends the node's storage (Prepare) and the
// coordinator writes .metadata. A heartbeat carries progress both ways.
//
// States: PENDING → STAGING → WRITING → COMMITTING → COMMITTED, or FAILED /
// CANCELLED from any non-final state (files removed, memory released).
//
// Thread-safety: all public methods are thread-safe and never block on I/O;
// callbacks run exactly once, on the calling thread or a daemon thread,
// never with the manager's lock held.
#ifndef CKPTD_DAEMON_CHECKPOINT_MANAGER_H_
#define CKPTD_DAEMON_CHECKPOINT_MANAGER_H_

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
#include "daemon/cluster.h"
#include "daemon/gpu_stager.h"
#include "daemon/options.h"
#include "format/save_plan.h"
#include "shm/fd_passing.h"

namespace ckptd::daemon {

// Bytes [item_offset, item_offset + length) of item `item`, found at
// [arena_offset, arena_offset + length) of the batch's arena.
struct ExtentRef {
  uint32_t item = 0;
  uint64_t item_offset = 0;
  uint64_t arena_offset = 0;
  uint64_t length = 0;
  // k > 0: the bytes are at arena_offset of SaveBatch::cuda_buffers[k - 1]
  // instead (the GPU path).
  uint32_t cuda_buffer = 0;
};

// SaveRequest.cluster: the ranks of this node in a multi-node checkpoint.
struct ClusterSpec {
  std::string coordinator;       // peer address of rank 0's daemon
  std::vector<int> local_ranks;  // ascending
  int num_nodes = 1;             // 1: single-node (the other fields unused)
  bool operator==(const ClusterSpec&) const = default;
};

// One Save call, decoded from its proto by the service.
struct SaveBatch {
  std::string checkpoint_id;  // as the client gave it (resolved here)
  std::string job;            // empty: the checkpoint directory's parent
  int rank = 0;
  int world_size = 0;
  uint32_t sequence = 0;
  std::vector<format::ItemDesc> items;  // sequence 0: the rank's index
  std::vector<uint64_t> item_nbytes;    // parallel to items
  uint64_t arena_id = 0;
  std::vector<ExtentRef> extents;
  bool last = false;
  bool overwrite = false;
  bool dedup_save_to_lowest_rank = false;
  int keep_last_n = 0;  // 0: DaemonOptions::keep_last_n
  ClusterSpec cluster;  // sequence 0
  std::vector<CudaBufferDesc> cuda_buffers;  // named by extents' cuda_buffer
};

// The GPU path as the daemon runs it (GetInfo).
struct CudaInfo {
  bool available = false;          // device extents are accepted
  std::string unavailable_reason;  // otherwise: why not
  uint64_t pinned_bytes = 0;       // the pinned staging pool
  uint64_t pinned_in_use = 0;
  std::vector<std::string> devices;  // PCI bus ids
};

enum class State : int {
  kPending = 1,
  kStaging = 2,
  kStaged = 3,
  kWriting = 4,
  kCommitting = 5,
  kCommitted = 6,
  kFailed = 7,
  kCancelled = 8,
};
std::string_view StateName(State state);
bool IsFinal(State state);

struct CheckpointInfo {
  std::string checkpoint_id;  // resolved absolute directory
  std::string job;
  State state = State::kPending;
  int world_size = 0;
  int ranks_staged = 0;
  uint64_t total_bytes = 0;
  uint64_t staged_bytes = 0;
  uint64_t written_bytes = 0;
  uint64_t file_bytes = 0;
  absl::Status error;  // FAILED / CANCELLED
  absl::Time created;
  absl::Time staged = absl::InfinitePast();    // InfinitePast: not yet
  absl::Time finished = absl::InfinitePast();  // InfinitePast: not yet
  uint64_t items = 0;
  uint32_t files = 0;
  // Multi-node: ranks_staged and the byte counts above are global (as of
  // the last heartbeat); these are the node's own.
  int num_nodes = 1;
  std::string coordinator;  // empty on the coordinator's node
  bool is_coordinator = false;
  int nodes_planned = 0;
  int nodes_prepared = 0;
  int local_ranks = 0;
  int local_ranks_staged = 0;
  uint64_t local_total_bytes = 0;
  uint64_t local_written_bytes = 0;
  uint64_t local_staged_bytes = 0;  // the node's own staged bytes
};

struct SaveReply {
  std::string checkpoint_id;
  State state = State::kStaging;  // kStaged after the rank's last batch
  uint64_t staged_bytes = 0;      // of this rank
};

// What start-up recovery found in the journal of unfinished checkpoints.
struct RecoveryReport {
  std::vector<std::string> removed;    // unfinished: data files removed
  std::vector<std::string> completed;  // had .metadata (crash after commit)
  std::vector<std::string> errors;     // could not be cleaned up
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

using SaveCallback = absl::AnyInvocable<void(absl::StatusOr<SaveReply>) &&>;
using InfoCallback = absl::AnyInvocable<void(absl::StatusOr<CheckpointInfo>) &&>;
using DoneCallback = absl::AnyInvocable<void(absl::Status) &&>;

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
                                         std::string_view owner, int64_t client_pid = 0);
  // Arenas passed as descriptors over the arena socket (arena_listener.h):
  // takes `fd` (closed on failure too), which must be a memfd sealed against
  // shrinking and at least `size` bytes (shm::Mapping::FromFd), so nothing
  // the client does later can make the daemon fault. `peer` is the
  // connection's SO_PEERCRED: the arena belongs to peer.uid (ArenaEntry::uid,
  // verified_uid) and counts against its quota. Beyond max_arenas,
  // max_arenas_per_client or max_arena_bytes_per_client: RESOURCE_EXHAUSTED
  // naming the uid and the limit.
  absl::StatusOr<uint64_t> RegisterArenaFd(int fd, uint64_t size, std::string_view owner,
                                           const shm::PeerCredentials& peer);
  // Unmaps the arena once no checkpoint holds bytes of it.
  absl::Status ReleaseArena(uint64_t arena_id);
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
  // `done` runs when the checkpoint is final, or with DEADLINE_EXCEEDED at
  // `deadline`. Returns a token for CallerGone.
  uint64_t Wait(std::string_view checkpoint_id, absl::Time deadline,
                InfoCallback done);

  // Bytes of arenas currently held by checkpoints (<= staging_budget).
  uint64_t staged_bytes_in_use() const;
  // Arenas currently registered (<= max_arenas).
  int arenas_registered() const;

  // The GPU path: whether device extents are accepted, the pinned pool.
  CudaInfo cuda_info() const;

  // The coordinator of the multi-node checkpoints whose rank 0 is on this
  // node; the peer service hands it the other nodes' calls.
  CoordinatorLink* coordinator();

 private:
  class Impl;
  explicit CheckpointManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CHECKPOINT_MANAGER_H_
