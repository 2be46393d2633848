// Copyright 2026 The ckptd Authors.
//
// SaveCore: what the parts of the save orchestrator share — the options
// and the stages' objects made at start-up, the I/O pool and, under the one
// mutex `mu`, the attempts of every checkpoint (attempt.h), the Save calls
// and batches in flight and who owns each directory — with its start-up,
// shutdown, lookups and timers. The facade (checkpoint_manager.h) owns the
// one SaveCore of a daemon; every part of daemon/save/ (checkpoint_manager.h
// lists them under "Files") is a set of functions that take it by
// reference.
//
// Calls from one part into another name the part's namespace (intake::,
// tasks::, cluster_link::, external_commit::, attempt::); unqualified calls
// stay in the part or go to the core (this file).
//
// Locking: one mutex, `mu`. The fields below are grouped as constant after
// Start, guarded by mu (annotated), or guarded by history_io_mu (taken
// before mu, never under it). No I/O runs under mu; callbacks collected
// under it run after it is released (Deferred).
#ifndef CKPTD_DAEMON_SAVE_SAVE_CORE_H_
#define CKPTD_DAEMON_SAVE_SAVE_CORE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/rate_limiter.h"
#include "common/tasks.h"
#include "daemon/arena/arena_registry.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/shares.h"
#include "daemon/commit/committer.h"
#include "daemon/commit/journal.h"
#include "daemon/commit/recovery.h"
#include "daemon/commit/retention.h"
#include "daemon/options.h"
#include "daemon/staging/gpu_stager.h"
#include "daemon/staging/save_validator.h"
#include "daemon/staging/staging_pool.h"
#include "daemon/tier/memory_tier.h"

namespace ckptd::daemon::save {

struct Checkpoint;    // attempt.h
struct PendingBatch;  // intake.h

// A directory's claim (SaveCore::dirs): the one attempt whose tasks may
// touch files in it, and the attempts whose plan waits for it (oldest
// first).
struct DirClaim {
  uint64_t owner = 0;  // Checkpoint::seq, or kRetentionOwner
  std::deque<std::shared_ptr<Checkpoint>> queued;
};
// DirClaim::owner while retention deletes the directory.
inline constexpr uint64_t kRetentionOwner = ~uint64_t{0};
// DirClaim::owner while start-up recovery has deferred its decision on a
// node's share of the directory (SaveCore::deferred_recoveries).
inline constexpr uint64_t kRecoveryOwner = ~uint64_t{0} - 1;

struct SaveCore {
  // The stages' objects made from `options` (FinalizeOptions done,
  // options.env set); Start does the rest.
  explicit SaveCore(const DaemonOptions& options);
  ~SaveCore();
  SaveCore(const SaveCore&) = delete;
  SaveCore& operator=(const SaveCore&) = delete;

  // --- Constant after Start ----------------------------------------------
  const DaemonOptions options;
  Env* const env;
  Clock* const clock;
  const SaveValidatorOptions validator;
  const CommitterOptions committer;
  Journal journal;
  RateLimiter limiter;
  // Committed checkpoints kept in memory (memory_tier_bytes; thread-safe).
  MemoryTier tier;
  RecoveryReport recovery;
  int shm_dir_fd = -1;
  // The GPU path; null when CUDA is off or unusable (cuda_unavailable says
  // why).
  std::unique_ptr<GpuStager> stager;
  std::string cuda_unavailable;
  std::unique_ptr<ThreadPool> pool;
  std::thread housekeeper;
  std::unique_ptr<Coordinator> coordinator;
  // Peer replicas and restores from other daemons' memory (shares.h); null
  // without a peer service (options.share_link_factory unset).
  std::unique_ptr<Shares> shares;

  // --- Guarded by mu -----------------------------------------------------
  mutable absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  uint64_t next_token ABSL_GUARDED_BY(mu) = 1;
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  absl::BitGen attempt_ids ABSL_GUARDED_BY(mu);
  ArenaRegistry arenas ABSL_GUARDED_BY(mu);
  StagingPool staging ABSL_GUARDED_BY(mu);
  History history ABSL_GUARDED_BY(mu);
  // Directory → its attempt: the one in progress, or the last settled one.
  absl::flat_hash_map<std::string, std::shared_ptr<Checkpoint>> ckpts
      ABSL_GUARDED_BY(mu);
  int link_callbacks ABSL_GUARDED_BY(mu) = 0;  // cluster_link's LinkCallback
  // Save calls: token → (checkpoint, rank).
  absl::flat_hash_map<uint64_t, std::pair<std::weak_ptr<Checkpoint>, int>>
      save_calls ABSL_GUARDED_BY(mu);
  // Batches waiting in `staging` for budget, by Save token.
  absl::flat_hash_map<uint64_t, std::unique_ptr<PendingBatch>> waiting
      ABSL_GUARDED_BY(mu);
  // Batches whose device extents the stager is copying, by Save token.
  absl::flat_hash_map<uint64_t, std::unique_ptr<PendingBatch>> device_staging
      ABSL_GUARDED_BY(mu);
  // Directory → its claim. An attempt owns its directory from its plan task
  // until it is committed, or failed and cleaned up; retention owns a
  // directory while deleting it. So a cancelled attempt's late plan step or
  // cleanup can never touch the files of a retry of the same directory.
  absl::flat_hash_map<std::string, DirClaim> dirs ABSL_GUARDED_BY(mu);
  // Start-up recovery's deferred decisions (recovery.h), each owning its
  // directory (kRecoveryOwner) until Tick settles it when due.
  std::vector<Recovered::Later> deferred_recoveries ABSL_GUARDED_BY(mu);
  // (job, coordinator) → digest of the last index this node sent there (a
  // repeat is sent as its digest only: the coordinator's plan cache).
  absl::flat_hash_map<std::string, uint64_t> sent_digest ABSL_GUARDED_BY(mu);

  // Serializes history file rewrites (taken before mu, never under it).
  absl::Mutex history_io_mu ABSL_ACQUIRED_BEFORE(mu);
  // (job, uid) → journal entries of commits whose history write failed
  // (step 7): the job's next successful history write records them too
  // (a record holds the job's whole history), and retires them.
  absl::flat_hash_map<std::pair<std::string, int64_t>, std::vector<std::string>>
      unrecorded_journals ABSL_GUARDED_BY(history_io_mu);
};

// Start-up: the journal and the state directories, the recovery of
// unfinished checkpoints, the history, the I/O pool, the GPU stager, the
// coordinator and the housekeeper thread.
absl::Status Start(SaveCore& core);
// The GPU stager, if options.cuda lets it start (cuda=on: it must).
absl::Status StartGpu(SaveCore& core);
// From now on saves are refused; every unfinished checkpoint that is not
// committing fails with `why`, and arena waiters are answered. Idempotent.
void BeginShutdown(SaveCore& core, const absl::Status& why);
// BeginShutdown, then the stager, the housekeeper, the coordinator and the
// link callbacks still due are waited for, and the pool is drained.
void Shutdown(SaveCore& core);

// The checkpoint directory `id` names under the roots. realpath is I/O
// (slow on NFS): called before taking mu.
absl::StatusOr<std::string> Resolve(const SaveCore& core, std::string_view id)
    ABSL_LOCKS_EXCLUDED(core.mu);
// The checkpoint `id` names, as given or as `resolved` (Resolve); null if
// none is known.
std::shared_ptr<Checkpoint> FindLocked(
    SaveCore& core, std::string_view id,
    const absl::StatusOr<std::string>& resolved)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// The registered arena `arena_id` (null if unknown or expired); counts as a
// use of it.
std::shared_ptr<const Arena> FindArena(SaveCore& core, uint64_t arena_id);

// One pass of the timers at `now`: each unfinished checkpoint's deadlines
// (attempt::TickLocked), settled checkpoints forgotten after forget_after,
// idle arenas unmapped.
void Tick(SaveCore& core, absl::Time now);
// Start-up recovery's deferred decisions that are due at `now`, made on
// the pool; each gives its directory back after.
void SettleDueRecoveriesLocked(SaveCore& core, absl::Time now, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// The housekeeper thread's loop: Tick every 100 ms until stopping.
void Housekeeping(SaveCore& core);

}  // namespace ckptd::daemon::save

#endif  // CKPTD_DAEMON_SAVE_SAVE_CORE_H_
