// Copyright 2026 The ckptd Authors.
//
// Restorer: restores through the daemon (docs/restore.md), beside the
// CheckpointManager and free of gRPC. It serves GetRestoreIndex and Restore
// calls decoded by service/:
//
//   Restore(RestoreBatch)    on a restore thread: the directory resolved
//     │                      under the roots, the arena found (one passed
//     │                      over the arena socket: its uid is the caller)
//     ▼
//   restore_groups           batch k of every local rank of the group
//     │                      → GroupBatch (or at the gather deadline)
//     ▼
//   checkpoint_cache         .metadata decoded once per node → reader
//     │                      (the caller's uid must be able to read it)
//     ▼
//   batch_reader             each distinct box read once, into a group
//                            buffer the members fetch over the arena
//                            socket (or copied into their arenas)
//                            → one RestoreReply each
//
// Each restore (a group's load, restore_progress.h) has an id, progress
// and can be cancelled: ListRestores / CancelRestore.
//
// Thread-safety: all public methods are thread-safe and never block on I/O;
// callbacks run exactly once, on a restore thread, never with a lock held.
// Nothing waits without an end: a group batch is served at its gather
// deadline with the ranks that came; Shutdown answers what is still
// gathering with UNAVAILABLE.
#ifndef CKPTD_DAEMON_RESTORE_RESTORER_H_
#define CKPTD_DAEMON_RESTORE_RESTORER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/tasks.h"
#include "daemon/restore/checkpoint_cache.h"
#include "daemon/restore/group_buffers.h"
#include "daemon/restore/restore_groups.h"
#include "daemon/restore/restore_progress.h"
#include "daemon/restore/restore_types.h"

namespace ckptd::daemon {

struct RestorerOptions {
  std::vector<std::string> checkpoint_roots;
  Env* env = Env::Default();
  Clock* clock = Clock::Real();
  absl::Duration gather_timeout = absl::Seconds(10);
  int threads = 2;        // group batches served at once
  int read_threads = 4;   // CheckpointReader threads of one batch
  bool direct_io = true;  // CheckpointReaderOptions::direct_io
  int cached_checkpoints = 4;
  // Group buffers alive at once (restore_buffer_bytes; 0: none, every
  // group batch goes through the ranks' arenas).
  uint64_t buffer_bytes = uint64_t{1} << 30;
  // The registered arena of an id (CheckpointManager::FindArena).
  std::function<std::shared_ptr<const Arena>(uint64_t)> find_arena;
  // Told of restore events (metrics); not owned, may be null.
  RestoreObserver* observer = nullptr;
  // Committed checkpoints held in memory (CheckpointManager::memory_tier);
  // not owned, must outlive the restorer; null: every byte from storage.
  MemoryTier* memory_tier = nullptr;
  // Other daemons' memory (peer_replicas, peer_env.h); not owned, must
  // outlive the restorer; null: none. peer_restore=missing: only for files
  // gone from storage.
  ShareSource* peers = nullptr;
  bool peers_only_missing = false;
  // Run the gather deadlines on a thread of its own every 100 ms (tests
  // on a SimulatedClock turn it off and call Tick).
  bool housekeeping_thread = true;
};

class Restorer {
 public:
  explicit Restorer(RestorerOptions options);
  // Shutdown().
  ~Restorer();

  // The index of `checkpoint_id` for the user of arena `arena_id` (0: only
  // if everyone may read the checkpoint).
  void GetIndex(std::string checkpoint_id, uint64_t arena_id,
                IndexCallback done);
  // One rank's batch; `done` gets the reply when the group batch is served.
  void Restore(RestoreBatch batch, RestoreCallback done);

  // The restores running and the newest ended ones, with their progress.
  std::vector<RestoreProgressInfo> ListRestores() const;
  // Cancels restore `id` (RestoreProgress::Cancel): what its ranks have
  // gathering is answered CANCELLED now, their later batches too; a batch
  // being read stops at its next saved chunk (or 8 MiB block of a large
  // record) and is answered CANCELLED.
  absl::Status CancelRestore(const std::string& id, const std::string& reason);

  // The arena listener's "CKB1" requests (group_buffers.h).
  absl::StatusOr<shm::FetchedFd> FetchGroupBuffer(const std::string& token,
                                                  uint32_t uid);

  // Gather deadlines at `now` (the housekeeping thread calls it).
  void Tick(absl::Time now);
  // Batches gathering now.
  int gathering() const;
  // Answers everything gathering with UNAVAILABLE and joins the threads.
  void Shutdown();

 private:
  // Resolves the directory and the caller's arena (on a restore thread).
  absl::StatusOr<std::string> Resolve(const std::string& checkpoint_id);
  void Dispatch(std::vector<GroupBatch> ready);
  void Serve(GroupBatch group);
  // Progress of the restore `group` belongs to, after it was served.
  void RecordServed(const GroupBatch& group,
                    const std::vector<absl::StatusOr<RestoreReply>>& results);
  void Housekeeping();

  const RestorerOptions options_;
  CheckpointCache cache_;
  GroupBuffers buffers_;
  ThreadPool pool_;
  mutable absl::Mutex mu_;
  RestoreGroups groups_ ABSL_GUARDED_BY(mu_);
  RestoreProgress progress_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread housekeeper_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_RESTORER_H_
