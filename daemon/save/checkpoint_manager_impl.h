// Copyright 2026 The ckptd Authors.
//
// The orchestrator's inside (internal to checkpoint_manager*.cc; no stage
// includes it): the record it keeps of each checkpoint attempt, and the
// class that moves attempts through the stages.
//
// The orchestrator alone changes a checkpoint's state, fails it, schedules
// its tasks and answers its callers. Each stage is called with plain
// structs and returns a Status plus its struct (save_types.h):
//
//   Save ─ staging/save_validator ─ staging/staging_pool (+ arena_registry,
//   gpu_stager) ─▶ plan/node_planner (or cluster/participant + the
//   coordinator) ─▶ write/rank_writer ─▶ commit/committer (+ journal,
//   retention; recovery at start-up)
//
// Files: checkpoint_manager.cc (start-up, shutdown, queries, timers),
// checkpoint_save.cc (the Save path through staging), checkpoint_tasks.cc
// (the pool tasks that run the planner, the writers, the committer and the
// cleanup; failure), checkpoint_cluster.cc (the node side of multi-node
// checkpoints).
//
// Locking: one mutex, mu_. Members are grouped below as constant after
// Start, guarded by mu_ (annotated), or owned by one task at a time. The
// fields of a Checkpoint record are guarded by mu_ too, except those
// marked "task-owned" (only the task holding the rank's `busy` flag, or the
// plan task before `dir_ready`, touches them) and the atomics. No I/O runs
// under mu_; callbacks collected under it run after it is released
// (Deferred).
#ifndef CKPTD_DAEMON_SAVE_CHECKPOINT_MANAGER_IMPL_H_
#define CKPTD_DAEMON_SAVE_CHECKPOINT_MANAGER_IMPL_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/tasks.h"
#include "daemon/arena/arena_registry.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/participant.h"
#include "daemon/commit/checkpoint_dir.h"
#include "daemon/commit/committer.h"
#include "daemon/commit/journal.h"
#include "daemon/commit/retention.h"
#include "daemon/save/checkpoint_manager.h"
#include "daemon/staging/gpu_stager.h"
#include "daemon/staging/save_validator.h"
#include "daemon/staging/staging_pool.h"
#include "daemon/tier/memory_tier.h"
#include "daemon/write/rank_writer.h"
#include "daemon/write/rate_limiter.h"

namespace ckptd::daemon {

// Checkpoint::uid of a checkpoint saved by ranks of several users.
inline constexpr int64_t kMixedUid = -2;

struct Checkpoint;

// A validated batch waiting for staging budget (StagingPool) or for the
// GPU stager's copies.
struct PendingBatch {
  uint64_t token = 0;
  std::shared_ptr<Checkpoint> ckpt;
  int rank = 0;
  std::vector<StagedExtent> extents;
  uint64_t bytes = 0;
  uint64_t arena_bytes = 0;  // of `bytes`: held in the arena (the budget)
  std::vector<CudaBufferDesc> cuda_buffers;
  bool device_pending = false;  // device extents not yet copied to the pool
  bool last = false;
  SaveCallback done;
};

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
  int keep_last_n = 0;  // 0: options_.keep_last_n
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
  // Directory ownership (Impl::dirs_): only the attempt that owns `dir`
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

CheckpointInfo InfoOf(const Checkpoint& c);
// Drops what a settled checkpoint no longer needs: a finished checkpoint
// costs a few hundred bytes, whatever its world size and item count.
void Compact(Checkpoint& c);

class CheckpointManager::Impl {
 public:
  explicit Impl(const DaemonOptions& options);

  absl::Status Start();
  void BeginShutdown(const absl::Status& why);
  void Shutdown();
  CudaInfo cuda_info() const;
  MemoryTier* memory_tier() { return &tier_; }
  const DaemonOptions& options() const { return options_; }
  const RecoveryReport& recovery() const { return recovery_; }
  CoordinatorLink* coordinator() { return coordinator_.get(); }

  absl::StatusOr<uint64_t> RegisterArena(std::string_view name, uint64_t size,
                                         std::string_view owner,
                                         int64_t client_pid);
  absl::StatusOr<uint64_t> RegisterArenaFd(int fd, uint64_t size,
                                           std::string_view owner,
                                           const shm::PeerCredentials& peer);
  absl::Status ReleaseArena(uint64_t id);
  std::shared_ptr<const Arena> FindArena(uint64_t id);
  uint64_t WaitArenaIdle(uint64_t id, absl::Time deadline, DoneCallback done);
  uint64_t Save(SaveBatch batch, SaveCallback done);
  void CallerGone(uint64_t token);
  absl::StatusOr<CheckpointInfo> GetStatus(std::string_view id);
  std::vector<CheckpointInfo> List(std::string_view job, bool include_disk);
  absl::StatusOr<State> Cancel(std::string_view id, std::string_view reason);
  uint64_t Wait(std::string_view id, absl::Time deadline, InfoCallback done,
                bool until_data_durable);
  // DCP's StorageWriter (checkpoint_external.cc).
  absl::StatusOr<Layout> GetLayout(std::string_view id, uint64_t arena_id);
  absl::Status CommitMetadata(std::string_view id, uint64_t arena_id,
                              std::string metadata);
  uint64_t staged_bytes_in_use() const;
  int arenas_registered() const;
  // One pass of the timers (stage, batch gap, peers, waiters, arenas) at
  // `now`; the housekeeper thread runs it every 100 ms.
  void Tick(absl::Time now);

 private:
  // --- Save path (checkpoint_save.cc) ------------------------------------
  absl::Status StartGpu();
  // Save under the lock, for the resolved directory `dir`; errors go to the
  // caller (and fail the checkpoint where it exists).
  absl::Status SaveLocked(SaveBatch& batch, const std::string& dir,
                          uint64_t token, SaveCallback& done, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attempt a batch belongs to: the one in progress at its directory,
  // or a new one (sequence 0).
  absl::StatusOr<std::shared_ptr<Checkpoint>> AttemptLocked(
      SaveBatch& batch, const std::string& dir)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Checkpoint>> NewAttemptLocked(
      SaveBatch& batch, const std::string& dir)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A batch's rank, sequence and options against its checkpoint.
  absl::Status CheckBatchLocked(const Checkpoint& c, const SaveBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The batch's extents validated and, for an arena, held.
  absl::StatusOr<std::unique_ptr<PendingBatch>> StageBatchLocked(
      Checkpoint& c, SaveBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdmitLocked(Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdoptLocked(PendingBatch& pb, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The GPU path: the batch's device extents go to the stager; its copies
  // done, DeviceStaged adopts the batch with the pinned pieces.
  void StageDeviceLocked(std::unique_ptr<PendingBatch> pb, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeviceStaged(const std::shared_ptr<Checkpoint>& c, uint64_t token,
                    absl::StatusOr<StageResult> result);
  // Answers a batch that will not be adopted and gives back what it holds.
  void DropBatchLocked(PendingBatch& pb, const absl::Status& error, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseExtentLocked(const StagedExtent& e, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoint `id` names, as given or as `resolved` (Resolve, called
  // before taking mu_).
  std::shared_ptr<Checkpoint> FindLocked(
      std::string_view id, const absl::StatusOr<std::string>& resolved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> Resolve(std::string_view id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps at most kMaxFinishedKept settled checkpoints in ckpts_.
  void ForgetOldestFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's checks of one unfinished checkpoint.
  void TickCheckpointLocked(const std::shared_ptr<Checkpoint>& c,
                            absl::Time now, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Housekeeping();

  // --- Tasks (checkpoint_tasks.cc) ---------------------------------------
  // Submits c's plan task once c owns its directory: at once if no other
  // attempt at the same directory owns it, else when that attempt gives it
  // back (ReleaseDirLocked). No task ever waits on a pool thread for
  // another task: a retried save waits here, off the pool.
  void StartPlanLocked(const std::shared_ptr<Checkpoint>& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseDirLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseDirOwnerLocked(const std::string& dir, uint64_t owner,
                             Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SubmitPlanLocked(const std::shared_ptr<Checkpoint>& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SubmitLocked(const std::shared_ptr<Checkpoint>& c, Task t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleRankLocked(const std::shared_ptr<Checkpoint>& c, int r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan is in (single-node planner or the coordinator's answer): the
  // writers are made and scheduled.
  void ApplyPlanLocked(const std::shared_ptr<Checkpoint>& c, WritePlan plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step 0 (journal) and step 1 (directory) of an attempt, off the lock;
  // RecordAttemptLocked keeps what was made (also after a failure: the
  // cleanup removes it).
  struct PreparedAttempt {
    absl::Status status;
    std::string journal_path;  // empty: step 0 failed
    PreparedDirectory dir;     // dir.dir null: step 1 failed
  };
  PreparedAttempt PrepareAttempt(const CommitRecord& record, bool check_marker,
                                 bool overwrite,
                                 const format::StepCheck& before_remove);
  void RecordAttemptLocked(Checkpoint& c, PreparedAttempt& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunPlan(std::shared_ptr<Checkpoint> c);
  void RunRankWriter(std::shared_ptr<Checkpoint> c, int r);
  // The rank writer's pass over `work` is done: bytes released, replies,
  // the rank finished.
  void RankPassDoneLocked(const std::shared_ptr<Checkpoint>& c, int r,
                          const std::vector<StagedExtent>& work,
                          uint64_t file_growth, const absl::Status& s,
                          Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunCommit(std::shared_ptr<Checkpoint> c);
  // An external_metadata attempt's data is durable: it now awaits
  // CommitMetadata; until_data_durable waiters are answered
  // (checkpoint_external.cc).
  void DataDurableLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The external_metadata attempt `id` names, awaiting its `.metadata`, if
  // the caller (`arena`) is its saver; else the precise error for `what`.
  absl::StatusOr<std::shared_ptr<Checkpoint>> AwaitingMetadataLocked(
      std::string_view id, const absl::StatusOr<std::string>& resolved,
      const Arena* arena, uint64_t arena_id, std::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails an attempt that awaited its `.metadata` beyond metadata_timeout.
  void TickMetadataLocked(const std::shared_ptr<Checkpoint>& c, absl::Time now,
                          Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunCleanup(std::shared_ptr<Checkpoint> c);
  void FailLocked(const std::shared_ptr<Checkpoint>& c, absl::Status error,
                  State state, Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommittedLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TaskEndLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TaskEnd(const std::shared_ptr<Checkpoint>& c) ABSL_LOCKS_EXCLUDED(mu_);
  // Held by a coordinator-link callback (on a gRPC thread) for its whole
  // body, the work it defers past the lock included. Its task's end
  // (busy_tasks) comes before that deferred work runs, so Shutdown also
  // waits until no callback holds one: the body may use the manager to its
  // last statement.
  class LinkCallback {
   public:
    explicit LinkCallback(Impl* m) ABSL_LOCKS_EXCLUDED(m->mu_) : m_(m) {
      absl::MutexLock l(&m_->mu_);
      ++m_->link_callbacks_;
    }
    ~LinkCallback() {
      absl::MutexLock l(&m_->mu_);
      --m_->link_callbacks_;
    }
    LinkCallback(const LinkCallback&) = delete;
    LinkCallback& operator=(const LinkCallback&) = delete;

   private:
    Impl* const m_;
  };
  void MaybeCleanupLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step 7 of a commit: the history recorded durably, then the attempt's
  // journal entry removed (`journal_path`; empty: none), then what
  // retention lets go deleted (journaled). rule.keep_last_n <= 0:
  // options_.keep_last_n; retain=false only records (a multi-node
  // checkpoint's retention is its coordinator's).
  // After step 6: the memory tier holds what c's writers captured.
  void HoldInMemory(const std::shared_ptr<Checkpoint>& c);
  void SettleCommit(const CommitRecord& commit, const std::string& journal_path,
                    RetentionRule rule = {}, bool retain = true);

  // --- Multi-node, the node side (checkpoint_cluster.cc) -----------------
  absl::Status JoinClusterLocked(Checkpoint& c, const SaveBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunNodePlan(std::shared_ptr<Checkpoint> c);
  void SendPlan(std::shared_ptr<Checkpoint> c, PlanCall call);
  void ApplyNodePlan(const std::shared_ptr<Checkpoint>& c,
                     absl::StatusOr<NodePlan> plan);
  void RunNodePrepare(std::shared_ptr<Checkpoint> c);
  void PrepareAnswered(const std::shared_ptr<Checkpoint>& c,
                       absl::StatusOr<GlobalStatus> g);
  void NodeCommitted(const std::shared_ptr<Checkpoint>& c);
  // The coordinator could not be reached after this node prepared: the
  // checkpoint committed iff .metadata lists this node's storage.
  void ResolveInDoubt(std::shared_ptr<Checkpoint> c, absl::Status error);
  void HeartbeatLocked(const std::shared_ptr<Checkpoint>& c, absl::Time now,
                       Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HeartbeatAnswered(const std::shared_ptr<Checkpoint>& c,
                         absl::StatusOr<GlobalStatus> g);
  void AbortAtCoordinatorLocked(const std::shared_ptr<Checkpoint>& c,
                                absl::Status reason, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeProgress ProgressLocked(const Checkpoint& c) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Constant after Start ----------------------------------------------
  const DaemonOptions options_;
  Env* const env_;
  Clock* const clock_;
  const SaveValidatorOptions validator_;
  const CommitterOptions committer_;
  Journal journal_;
  RateLimiter limiter_;
  // Committed checkpoints kept in memory (memory_tier_bytes; thread-safe).
  MemoryTier tier_;
  RecoveryReport recovery_;
  int shm_dir_fd_ = -1;
  // The GPU path; null when CUDA is off or unusable (cuda_unavailable_ says
  // why).
  std::unique_ptr<GpuStager> stager_;
  std::string cuda_unavailable_;
  std::unique_ptr<ThreadPool> pool_;
  std::thread housekeeper_;
  std::unique_ptr<Coordinator> coordinator_;

  // --- Guarded by mu_ ----------------------------------------------------
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::BitGen attempt_ids_ ABSL_GUARDED_BY(mu_);
  ArenaRegistry arenas_ ABSL_GUARDED_BY(mu_);
  StagingPool staging_ ABSL_GUARDED_BY(mu_);
  History history_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Checkpoint>> ckpts_
      ABSL_GUARDED_BY(mu_);
  int link_callbacks_ ABSL_GUARDED_BY(mu_) = 0;  // LinkCallback
  // Save calls: token → (checkpoint, rank).
  absl::flat_hash_map<uint64_t, std::pair<std::weak_ptr<Checkpoint>, int>>
      save_calls_ ABSL_GUARDED_BY(mu_);
  // Batches waiting in staging_ for budget, by Save token.
  absl::flat_hash_map<uint64_t, std::unique_ptr<PendingBatch>> waiting_
      ABSL_GUARDED_BY(mu_);
  // Batches whose device extents the stager is copying, by Save token.
  absl::flat_hash_map<uint64_t, std::unique_ptr<PendingBatch>> device_staging_
      ABSL_GUARDED_BY(mu_);
  // Directory → the one attempt whose tasks may touch files in it, and the
  // attempts whose plan waits for it (oldest first). An attempt owns its
  // directory from its plan task until it is committed, or failed and
  // cleaned up; retention owns a directory while deleting it. So a
  // cancelled attempt's late plan step or cleanup can never touch the files
  // of a retry of the same directory.
  struct DirClaim {
    uint64_t owner = 0;  // Checkpoint::seq, or kRetentionOwner
    std::deque<std::shared_ptr<Checkpoint>> queued;
  };
  static constexpr uint64_t kRetentionOwner = ~uint64_t{0};
  absl::flat_hash_map<std::string, DirClaim> dirs_ ABSL_GUARDED_BY(mu_);
  // (job, coordinator) → digest of the last index this node sent there (a
  // repeat is sent as its digest only: the coordinator's plan cache).
  absl::flat_hash_map<std::string, uint64_t> sent_digest_ ABSL_GUARDED_BY(mu_);

  // Serializes history file rewrites (taken before mu_, never under it).
  absl::Mutex history_io_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // (job, uid) → journal entries of commits whose history write failed
  // (step 7): the job's next successful history write records them too
  // (a record holds the job's whole history), and retires them.
  absl::flat_hash_map<std::pair<std::string, int64_t>, std::vector<std::string>>
      unrecorded_journals_ ABSL_GUARDED_BY(history_io_mu_);
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_SAVE_CHECKPOINT_MANAGER_IMPL_H_
