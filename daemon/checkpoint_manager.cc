// Copyright 2026 The ckptd Authors.
//
// The durability protocol of one daemon checkpoint (a crash at any point
// leaves either the previous state or a complete checkpoint, and restart
// recovery removes what an unfinished one left behind):
//
//   0. (planner, before any data file exists)
//      a. a journal entry naming the directory is written durably
//         (state_dir/journal/N.journal: tmp → fsync → rename → fsync dir);
//      b. the directory is created; an existing .metadata is refused
//         (FAILED_PRECONDITION) or, with overwrite, removed and the
//         directory fsynced, so no stale commit marker can survive;
//   1. (writers) each __{rank}_0.distcp is written and fsynced, then closed;
//   2. (commit) the checkpoint directory is fsynced (the data files' names);
//   3. .metadata.tmp is written,
//   4. fsynced and renamed to .metadata,
//   5. the directory is fsynced — the checkpoint is committed;
//   6. the journal entry is removed; history and retention follow.
// A failure or cancel before 5 removes .metadata (if 4 renamed it in), the
// data files and the journal entry; the checkpoint is FAILED / CANCELLED.
// Recovery (Create): for each journal entry, a directory with .metadata is
// complete (crash between 5 and 6); otherwise its data files are removed.

#include "daemon/checkpoint_manager.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/checkpoint_dir.h"
#include "daemon/coordinator.h"
#include "daemon/cuda_driver.h"
#include "daemon/gpu_stager.h"
#include "daemon/paths.h"
#include "daemon/state_record.h"
#include "daemon/tasks.h"
#include "fmt/format.h"
#include "format/checkpoint_writer.h"
#include "format/metadata.h"
#include "format/tensor_payload.h"
#include "format/zip.h"
#include "shm/mapping.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

std::string_view StateName(State state) {
  switch (state) {
    case State::kPending: return "PENDING";
    case State::kStaging: return "STAGING";
    case State::kStaged: return "STAGED";
    case State::kWriting: return "WRITING";
    case State::kCommitting: return "COMMITTING";
    case State::kCommitted: return "COMMITTED";
    case State::kFailed: return "FAILED";
    case State::kCancelled: return "CANCELLED";
  }
  return "UNKNOWN";
}

bool IsFinal(State state) {
  return state == State::kCommitted || state == State::kFailed ||
         state == State::kCancelled;
}

namespace {

// CudaBuffers one Save may name (daemon.proto).
constexpr size_t kMaxCudaBuffers = 4096;
// Checkpoint::uid of a checkpoint saved by ranks of several users.
constexpr int64_t kMixedUid = -2;
// Finished checkpoints the daemon remembers for queries (Status, List,
// Wait), besides forget_after; each costs a few hundred bytes once settled.
constexpr size_t kMaxFinishedKept = 4096;

struct ArenaEntry {
  uint64_t id = 0;
  std::unique_ptr<shm::Mapping> map;
  std::string owner;
  // The Unix user the arena belongs to: for an arena passed over the arena
  // socket, the sender's SO_PEERCRED uid (verified_uid); for one opened by
  // name (in-process callers), the file owner's uid.
  uint32_t uid = 0;
  bool verified_uid = false;
  absl::Time last_used;
  uint64_t held_bytes = 0;  // named by extents not yet consumed
  bool released = false;    // ReleaseArena called
  struct IdleWaiter {
    uint64_t token;
    absl::Time deadline;
    DoneCallback done;
  };
  std::vector<IdleWaiter> idle_waiters;
};

// An adopted (or pending) byte range of an arena, or of the pinned staging
// pool (arena null, `hold` keeps the pool slab), or, before the GPU stager
// copied it, of a CUDA buffer (cuda_buffer > 0, data null: arena_offset is
// the offset in PendingBatch::cuda_buffers[cuda_buffer - 1]).
struct Extent {
  std::shared_ptr<ArenaEntry> arena;
  const char* data = nullptr;
  uint64_t arena_offset = 0;
  uint64_t length = 0;
  uint32_t item = 0;
  uint64_t item_offset = 0;
  std::shared_ptr<const void> hold;
  uint32_t cuda_buffer = 0;
};

struct Checkpoint;

// A validated batch waiting for staging budget.
struct PendingBatch {
  uint64_t token = 0;
  std::shared_ptr<Checkpoint> ckpt;
  int rank = 0;
  std::vector<Extent> extents;
  uint64_t bytes = 0;
  uint64_t arena_bytes = 0;  // of `bytes`: held in the arena (the budget)
  std::vector<CudaBufferDesc> cuda_buffers;
  bool device_pending = false;  // device extents not yet copied to the pool
  bool last = false;
  SaveCallback done;
};

// Streams one rank's surviving items into __{rank}_0.distcp, in index order.
// Used only by the writer task that holds the rank's `busy` flag.
struct RankWriter {
  std::string path;
  std::string relative_path;
  bool has_file = false;                 // the plan gave the rank a file
  std::vector<int64_t> plan_index;       // per item: SavePlan::items index or -1
  std::unique_ptr<WritableFile> file;
  bool created = false;
  uint32_t cur_item = 0;
  uint64_t cur_offset = 0;
  std::unique_ptr<format::ZipStreamWriter> zip;
  uint64_t item_start = 0;
  // The bytes item at the cursor, gathered for ValidateBytesItem.
  std::string bytes_item;
  bool finished = false;
};

// A bytes item larger than this is checked for its zip framing only (its
// first local header and its end record); smaller ones are parsed whole.
constexpr uint64_t kMaxBytesItemParse = uint64_t{256} << 20;

// What `ckptctl verify` checks of a bytes item, before the daemon commits
// it: a torch.save archive whose records match their CRCs and whose data.pkl
// parses (with the bounded VM: nothing runs).
absl::Status ValidateBytesItem(const std::string& fqn, std::string data, uint64_t nbytes) {
  auto bad = [&](const auto& why) {
    return absl::InvalidArgumentError(
        fmt::format("bytes item '{}' ({} bytes) is not a torch.save archive: {}", fqn, nbytes,
                    std::string(why.data(), why.size())));
  };
  if (nbytes > kMaxBytesItemParse) {
    // Framing only (data holds the first and last 64 KiB).
    if (!std::string_view(data).starts_with("PK\x03\x04")) {
      return bad(std::string_view("no zip local header at its start"));
    }
    return absl::OkStatus();
  }
  InMemoryFile file(std::move(data), fqn);
  absl::StatusOr<std::unique_ptr<format::ZipArchiveReader>> archive =
      format::ZipArchiveReader::Open(&file, 0, file.Size());
  if (!archive.ok()) return bad(archive.status().message());
  for (const format::ZipEntry& e : (*archive)->entries()) {
    if (absl::Status s = (*archive)->VerifyCrc(e); !s.ok()) return bad(s.message());
  }
  if (auto doc = format::ParseArchivePickle(**archive, uint64_t{1} << 30, fqn); !doc.ok()) {
    return bad(doc.status().message());
  }
  return absl::OkStatus();
}

struct RankState {
  bool indexed = false;
  std::vector<format::ItemDesc> items;
  std::vector<uint64_t> nbytes;
  uint64_t total = 0;
  // Arrival cursor (validation of extent order).
  uint32_t next_sequence = 0;
  uint32_t next_item = 0;
  uint64_t next_offset = 0;
  uint64_t received = 0;  // bytes named by validated batches
  bool last_received = false;
  uint64_t adopted = 0;   // bytes adopted against the budget
  bool staged = false;
  std::deque<Extent> queue;  // adopted, not yet consumed by the writer
  uint64_t consumed = 0;
  // A non-last batch's reply, sent when consumed >= consume_target.
  uint64_t consume_target = 0;
  uint64_t consume_token = 0;
  SaveCallback consume_done;
  uint64_t call_token = 0;  // the Save call in flight for this rank, 0: none
  // When the reply to a non-last batch went out (the client now owes the
  // next batch); InfinitePast while a call is in flight or after the last.
  absl::Time awaiting_next_since = absl::InfinitePast();
  bool busy = false;        // a writer task owns `writer`
  bool done = false;        // file written, fsynced and closed
  RankWriter writer;
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
  // The ranks saving through this daemon: all of them (single-node), or
  // this node's (cluster.num_nodes > 1).
  ClusterSpec cluster;
  std::vector<int> local;
  int num_local = 0;
  // Multi-node only.
  bool multi = false;
  bool is_coordinator = false;
  std::shared_ptr<CoordinatorLink> link;
  PeerCallId peer_id;
  GlobalStatus global;        // as of the last heartbeat
  bool plan_sent = false;     // the coordinator knows this node
  bool prepare_sent = false;  // local files durable, decision pending
  bool heartbeat_in_flight = false;
  bool in_doubt = false;  // resolving the decision from .metadata
  absl::Time prepare_sent_at = absl::InfinitePast();
  absl::Time last_heartbeat = absl::InfinitePast();  // sent
  absl::Time last_contact = absl::InfinitePast();    // answered
  absl::Status last_peer_error;
  State state = State::kPending;
  absl::Status error;
  absl::Time created, staged = absl::InfinitePast(), finished = absl::InfinitePast();
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
  bool dir_ready = false;  // step 0 done
  bool created_dir = false;
  // Step 0b opens the directory beneath its root without following
  // symlinks; every later step goes through io_dir, anchored to its fd.
  std::unique_ptr<CheckpointDir> dirh;
  std::string io_dir;
  std::string journal_path;
  format::SavePlan plan;
  std::vector<format::StorageInfo> infos;  // per plan item
  int busy_tasks = 0;      // plan / writer / commit tasks running or queued
  bool cleaned = false;
  // Directory ownership (Impl::dirs_): only the attempt that owns `dir`
  // touches files in it. Set when its plan is submitted; given back when
  // the attempt is committed, or failed and its files removed.
  bool owns_dir = false;
  bool cleanup_running = false;  // RunCleanup submitted, not yet finished
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
  };
  std::vector<Waiter> waiters;
};

CheckpointInfo InfoOf(const Checkpoint& c) {
  CheckpointInfo info;
  info.checkpoint_id = c.dir;
  info.job = c.job;
  info.state = c.state;
  info.world_size = c.world_size;
  info.ranks_staged = c.ranks_staged;
  info.total_bytes = c.total_bytes;
  info.staged_bytes = c.staged_bytes;
  info.written_bytes = std::max(c.written_bytes, c.written_live.load());
  info.error = c.error;
  info.created = c.created;
  info.staged = c.staged;
  info.finished = c.finished;
  for (const RankState& r : c.ranks) info.items += r.items.size();
  info.files = c.planned ? c.plan.files.size() : 0;
  if (c.compacted) {
    info.items = c.items_total;
    info.files = c.files_total;
  }
  if (c.state == State::kCommitted) info.file_bytes = c.written_bytes;
  info.local_ranks = c.num_local;
  info.local_ranks_staged = c.ranks_staged;
  info.local_total_bytes = c.total_bytes;
  info.local_written_bytes = info.written_bytes;
  info.local_staged_bytes = c.staged_bytes;
  if (c.multi) {
    info.num_nodes = c.cluster.num_nodes;
    info.is_coordinator = c.is_coordinator;
    if (!c.is_coordinator) info.coordinator = c.cluster.coordinator;
    info.nodes_planned = c.global.nodes_planned;
    info.nodes_prepared = c.global.nodes_prepared;
    // Global figures once the coordinator reported them (never below ours).
    info.ranks_staged = std::max(c.global.ranks_staged, c.ranks_staged);
    info.total_bytes = std::max(c.global.total_bytes, c.total_bytes);
    info.staged_bytes = std::max(c.global.staged_bytes, c.staged_bytes);
    info.written_bytes =
        std::max(c.global.written_bytes, info.local_written_bytes);
  }
  return info;
}

// Drops what a settled checkpoint no longer needs (its per-rank indexes,
// writers, plan and storage infos): a finished checkpoint costs a few
// hundred bytes, whatever its world size and item count.
void Compact(Checkpoint& c) {
  if (c.compacted) return;
  for (const RankState& r : c.ranks) c.items_total += r.items.size();
  c.files_total = c.planned ? c.plan.files.size() : 0;
  std::vector<RankState>().swap(c.ranks);
  c.plan = format::SavePlan();
  std::vector<format::StorageInfo>().swap(c.infos);
  c.dirh.reset();  // closes the directory's fds
  c.compacted = true;
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

bool IsDataFileName(std::string_view name) {
  return name.starts_with("__") && name.ends_with(".distcp");
}

// The rank of a data file name "__{rank}_{k}.distcp", or -1.
int DataFileRank(std::string_view name) {
  if (!IsDataFileName(name)) return -1;
  int rank = 0;
  size_t i = 2;
  for (;
       i < name.size() && name[i] >= '0' && name[i] <= '9' && rank < (1 << 24);
       ++i) {
    rank = rank * 10 + (name[i] - '0');
  }
  return i > 2 && i < name.size() && name[i] == '_' ? rank : -1;
}

// Removes a checkpoint directory's commit marker (durably) and data files,
// then the directory if that left it empty. With `ranks` (a node of a
// multi-node checkpoint), only those ranks' data files and no marker: the
// rest of the shared directory belongs to the other nodes and the
// coordinator. The directory is opened beneath its root without following
// symlinks (CheckpointDir): nothing outside the roots is ever removed.
absl::Status DeleteCheckpointFiles(Env* env, const std::vector<std::string>& roots,
                                   const std::string& dir,
                                   const std::vector<int>* ranks = nullptr) {
  absl::StatusOr<std::unique_ptr<CheckpointDir>> opened =
      CheckpointDir::Open(env, roots, dir, /*create=*/false);
  if (absl::IsNotFound(opened.status())) return absl::OkStatus();
  if (!opened.ok()) return opened.status();
  const std::string io = (*opened)->io_path();
  if (ranks == nullptr) {
    const std::string marker = JoinPath(io, format::kMetadataName);
    if (absl::Status s = env->RemoveFile(marker);
        !s.ok() && !absl::IsNotFound(s))
      return s;
    RETURN_IF_ERROR(env->SyncDir(io));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(io));
  for (const std::string& n : names) {
    const bool mine =
        ranks == nullptr
            ? IsDataFileName(n) ||
                  n == std::string(format::kMetadataName) + ".tmp"
            : std::binary_search(ranks->begin(), ranks->end(), DataFileRank(n));
    if (mine) {
      if (absl::Status s = env->RemoveFile(JoinPath(io, n)); !s.ok() && !absl::IsNotFound(s)) {
        return s;
      }
    }
  }
  RETURN_IF_ERROR(env->SyncDir(io));  // the removals, durably
  (void)(*opened)->RemoveIfEmpty();  // fails harmlessly if other files remain
  return absl::OkStatus();
}

}  // namespace

class CheckpointManager::Impl {
 public:
  explicit Impl(const DaemonOptions& options)
      : options_(options), env_(options.env), clock_(options.clock) {}

  absl::Status Start();
  absl::Status StartGpu();
  void Shutdown();
  CudaInfo cuda_info() const {
    CudaInfo info;
    info.available = stager_ != nullptr;
    info.unavailable_reason = cuda_unavailable_;
    if (stager_) {
      info.pinned_bytes = stager_->pool_bytes();
      info.pinned_in_use = stager_->pool_in_use();
      info.devices = stager_->devices();
    }
    return info;
  }

  const DaemonOptions& options() const { return options_; }
  const RecoveryReport& recovery() const { return recovery_; }
  CoordinatorLink* coordinator() { return coordinator_.get(); }

  absl::StatusOr<uint64_t> RegisterArena(std::string_view name, uint64_t size,
                                         std::string_view owner, int64_t client_pid);
  absl::StatusOr<uint64_t> RegisterArenaFd(int fd, uint64_t size, std::string_view owner,
                                           const shm::PeerCredentials& peer);
  // max_arenas and the per-uid quotas for one more arena of `size` bytes.
  absl::Status CheckArenaQuotaLocked(uint32_t uid, uint64_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `entry` a fresh random id and registers it.
  void InsertArenaLocked(const std::shared_ptr<ArenaEntry>& entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReleaseArena(uint64_t id);
  uint64_t WaitArenaIdle(uint64_t id, absl::Time deadline, DoneCallback done);
  uint64_t Save(SaveBatch batch, SaveCallback done);
  void CallerGone(uint64_t token);
  absl::StatusOr<CheckpointInfo> GetStatus(std::string_view id);
  std::vector<CheckpointInfo> List(std::string_view job, bool include_disk);
  absl::StatusOr<State> Cancel(std::string_view id, std::string_view reason);
  uint64_t Wait(std::string_view id, absl::Time deadline, InfoCallback done);
  uint64_t staged_bytes_in_use() const {
    absl::MutexLock l(&mu_);
    return budget_used_;
  }
  int arenas_registered() const {
    absl::MutexLock l(&mu_);
    return static_cast<int>(arenas_.size());
  }

 private:
  // Save, under the lock; errors go to the caller (and fail the checkpoint
  // where it exists).
  absl::Status SaveLocked(SaveBatch& batch, uint64_t token, SaveCallback& done,
                          Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RegisterIndexLocked(Checkpoint& c, SaveBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdmitLocked(Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdoptLocked(PendingBatch& pb, Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The GPU path: the batch's device extents go to the stager; its copies
  // done, DeviceStaged adopts the batch with the pinned pieces.
  void StageDeviceLocked(std::unique_ptr<PendingBatch> pb, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeviceStaged(const std::shared_ptr<Checkpoint>& c, uint64_t token,
                    absl::StatusOr<StageResult> result);
  // Answers a batch that will not be adopted and gives back what it holds.
  void DropBatchLocked(PendingBatch& pb, const absl::Status& error, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Save's CudaBuffers: this daemon stages CUDA, handles are 64 bytes,
  // devices are its own.
  absl::Status CheckCudaBuffersLocked(const SaveBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleRankLocked(const std::shared_ptr<Checkpoint>& c, int r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(const std::shared_ptr<Checkpoint>& c, absl::Status error, State state,
                  Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TaskEndLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCleanupLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseExtentLocked(const Extent& e, Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SubmitLocked(const std::shared_ptr<Checkpoint>& c, Task t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Submits c's plan task once c owns its directory: at once if no other
  // attempt at the same directory owns it, else when that attempt gives it
  // back (ReleaseDirLocked). No task ever waits on a pool thread for
  // another task: a retried save waits here, off the pool.
  void StartPlanLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // c gives its directory back (idempotent); the next queued attempt that is
  // still going gets it and its plan task.
  void ReleaseDirLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseDirOwnerLocked(const std::string& dir, uint64_t owner, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan task of c, which owns its directory (RunPlan, or RunNodePlan
  // for a node of a multi-node checkpoint).
  void SubmitPlanLocked(const std::shared_ptr<Checkpoint>& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // sent_digest_'s key: the job at its coordinator.
  static std::string SentDigestKey(const Checkpoint& c) {
    return c.job + "\n" + c.cluster.coordinator;
  }
  void RunPlan(std::shared_ptr<Checkpoint> c);
  void RunRankWriter(std::shared_ptr<Checkpoint> c, int r);
  void RunCommit(std::shared_ptr<Checkpoint> c);
  // Multi-node: the planner and commit steps through the coordinator.
  void RunNodePlan(std::shared_ptr<Checkpoint> c);
  void SendPlan(std::shared_ptr<Checkpoint> c, PlanCall call);
  void ApplyNodePlan(const std::shared_ptr<Checkpoint>& c,
                     absl::StatusOr<NodePlan> plan);
  void RunNodePrepare(std::shared_ptr<Checkpoint> c);
  void NodeCommitted(const std::shared_ptr<Checkpoint>& c);
  // The coordinator could not be reached after this node prepared: the
  // checkpoint committed iff .metadata lists this node's storage.
  void ResolveInDoubt(std::shared_ptr<Checkpoint> c, absl::Status error);
  void HeartbeatLocked(const std::shared_ptr<Checkpoint>& c, absl::Time now,
                       Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ClusterLocked(Checkpoint& c, const SaveBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunCleanup(std::shared_ptr<Checkpoint> c);
  absl::Status Consume(Checkpoint& c, int r, const Extent& e);
  absl::Status AdvanceItems(Checkpoint& c, int r);
  absl::Status OpenRankFile(Checkpoint& c, int r);
  // Sleeps as needed to keep writes under options_.write_rate_limit.
  void Throttle(uint64_t bytes, const std::atomic<bool>& aborted);

  absl::Status Recover();
  void LoadHistory();
  // A new, unique state_dir/journal/<time>-<pid>-<n>.journal path.
  std::string NewJournalPath() const {
    static std::atomic<uint64_t> counter{0};
    return JoinPath(JoinPath(options_.state_dir, "journal"),
                    fmt::format("{}-{}-{}.journal", absl::ToUnixMillis(absl::Now()), ::getpid(),
                                ++counter));
  }
  // keep_last_n <= 0: options_.keep_last_n; retain=false only records (a
  // multi-node checkpoint's retention is its coordinator's).
  void RecordCommitAndRetain(const std::string& job, int64_t uid, const std::string& dir,
                             int keep_last_n = 0, bool retain = true);
  void Housekeeping();

  std::shared_ptr<Checkpoint> FindLocked(std::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps at most kMaxFinishedKept settled checkpoints in ckpts_ (the
  // oldest go first; forget_after bounds their age).
  void ForgetOldestFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DaemonOptions options_;
  Env* const env_;
  const std::function<absl::Time()> clock_;
  RecoveryReport recovery_;
  // (job, dir) committed before a crash but not yet in the history.
  std::vector<JournalRecord> recovered_commits_;
  int shm_dir_fd_ = -1;

  mutable absl::Mutex mu_;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  // Arena ids are random 64-bit values, so an id from another client or from
  // an earlier daemon run names no arena here (NOT_FOUND / INVALID_ARGUMENT)
  // instead of someone else's.
  absl::BitGen arena_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<ArenaEntry>> arenas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Checkpoint>> ckpts_ ABSL_GUARDED_BY(mu_);
  // Save calls: token → (checkpoint, rank).
  absl::flat_hash_map<uint64_t, std::pair<std::weak_ptr<Checkpoint>, int>> save_calls_
      ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<PendingBatch>> admission_ ABSL_GUARDED_BY(mu_);
  uint64_t budget_used_ ABSL_GUARDED_BY(mu_) = 0;
  // Batches whose device extents the stager is copying, by Save token.
  absl::flat_hash_map<uint64_t, std::unique_ptr<PendingBatch>> device_staging_
      ABSL_GUARDED_BY(mu_);
  // The GPU path; null when CUDA is off or unusable (cuda_unavailable_ says
  // why).
  std::unique_ptr<GpuStager> stager_;
  std::string cuda_unavailable_;
  // job → committed directories, oldest first (state_dir/history).
  // (uid, job) → committed directories, oldest first (state_dir/history):
  // what retention may prune for a save of that job by that user.
  using HistoryKey = std::pair<int64_t, std::string>;
  absl::flat_hash_map<HistoryKey, std::vector<std::string>> history_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
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

  absl::Mutex history_io_mu_;  // serializes history file rewrites
  absl::Mutex throttle_mu_;
  absl::Time throttle_next_ ABSL_GUARDED_BY(throttle_mu_) = absl::InfinitePast();
  std::unique_ptr<ThreadPool> pool_;
  std::thread housekeeper_;
  std::unique_ptr<Coordinator> coordinator_;
  // (job, coordinator) → digest of the last index this node sent there (a
  // repeat is sent as its digest only: the coordinator's plan cache).
  absl::flat_hash_map<std::string, uint64_t> sent_digest_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------
// Start-up and shutdown
// ---------------------------------------------------------------------------

absl::Status CheckpointManager::Impl::Start() {
  RETURN_IF_ERROR(CreateDirsDurably(env_, JoinPath(options_.state_dir, "journal")));
  RETURN_IF_ERROR(CreateDirsDurably(env_, JoinPath(options_.state_dir, "history")));
  RETURN_IF_ERROR(env_->CreateDirs(options_.shm_dir));
  shm_dir_fd_ = ::open(options_.shm_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (shm_dir_fd_ < 0) {
    return absl::ErrnoToStatus(errno, fmt::format("open shm_dir {}", options_.shm_dir));
  }
  RETURN_IF_ERROR(Recover());
  LoadHistory();
  for (const JournalRecord& r : recovered_commits_) RecordCommitAndRetain(r.job, r.uid, r.dir);
  pool_ = std::make_unique<ThreadPool>(std::max(1, options_.io_threads));
  RETURN_IF_ERROR(StartGpu());
  CoordinatorOptions co;
  co.env = env_;
  co.checkpoint_roots = options_.checkpoint_roots;
  co.fsync = options_.fsync;
  co.stage_timeout = options_.stage_timeout;
  co.peer_timeout = options_.peer_timeout;
  co.commit_timeout = options_.commit_timeout;
  co.forget_after = std::min(options_.forget_after, absl::Hours(1));
  co.max_items = options_.max_items;
  co.max_world_size = options_.max_world_size;
  co.clock = clock_;
  co.on_commit = [this](const std::string& job, const std::string& dir,
                        int keep_last_n) {
    // The coordinator's node saves ranks of the checkpoint too: its owner.
    int64_t uid = kUnknownUid;
    {
      absl::MutexLock l(&mu_);
      if (auto it = ckpts_.find(dir); it != ckpts_.end()) uid = it->second->uid;
    }
    RecordCommitAndRetain(job, uid, dir, keep_last_n);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> coordinator,
                   Coordinator::Create(std::move(co)));
  coordinator_ = std::move(coordinator);
  housekeeper_ = std::thread([this] { Housekeeping(); });
  return absl::OkStatus();
}

absl::Status CheckpointManager::Impl::StartGpu() {
  if (options_.cuda == "off") {
    cuda_unavailable_ = "the daemon runs with cuda=off";
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<DeviceBackend>> backend =
      options_.device_backend != nullptr
          ? absl::StatusOr<std::shared_ptr<DeviceBackend>>(options_.device_backend)
          : OpenCudaBackend(options_.cuda_library, options_.cuda_streams);
  absl::StatusOr<std::unique_ptr<GpuStager>> stager =
      absl::FailedPreconditionError("no CUDA backend");
  if (backend.ok()) {
    GpuStager::Options so;
    so.pinned_bytes = options_.pinned_staging_bytes;
    stager = GpuStager::Create(*std::move(backend), so);
  } else {
    stager = backend.status();
  }
  if (!stager.ok()) {
    cuda_unavailable_ = std::string(stager.status().message());
    if (options_.cuda == "on") {
      return absl::FailedPreconditionError(fmt::format("cuda=on: {}", cuda_unavailable_));
    }
    spdlog::info("GPU path off (host saves only): {}", cuda_unavailable_);
    return absl::OkStatus();
  }
  stager_ = *std::move(stager);
  return absl::OkStatus();
}

void CheckpointManager::Impl::Shutdown() {
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    stopping_ = true;
    for (auto& [id, c] : ckpts_) {
      // A commit in progress is let finish (the pool drains below).
      if (!IsFinal(c->state) && c->state != State::kCommitting) {
        FailLocked(c, absl::UnavailableError("the daemon is shutting down"), State::kFailed, d);
      }
    }
    for (auto& [id, a] : arenas_) {
      for (auto& w : a->idle_waiters) {
        d.Add([done = std::move(w.done)]() mutable {
          std::move(done)(absl::UnavailableError("the daemon is shutting down"));
        });
      }
      a->idle_waiters.clear();
    }
  }
  // Copies in flight finish (their checkpoints failed above: they end their
  // tasks); queued ones are answered CANCELLED.
  if (stager_) stager_->Shutdown();
  if (housekeeper_.joinable()) housekeeper_.join();
  // Answers its nodes' pending calls (this node's included) with the abort.
  if (coordinator_) coordinator_.reset();
  {
    // Link callbacks (remote coordinators) still due: they end their tasks.
    std::vector<std::shared_ptr<CoordinatorLink>> links;
    {
      absl::MutexLock l(&mu_);
      for (const auto& [dir, c] : ckpts_) {
        if (c->link && !c->is_coordinator) links.push_back(c->link);
      }
    }
    for (auto& link : links) link->CancelCalls();
    absl::MutexLock l(&mu_);
    struct NoLinkCalls {
      const absl::flat_hash_map<std::string, std::shared_ptr<Checkpoint>>*
          ckpts;
      static bool Check(NoLinkCalls* w) {
        for (const auto& [dir, c] : *w->ckpts) {
          if (c->multi && c->busy_tasks > 0) return false;
        }
        return true;
      }
    } wait{&ckpts_};
    mu_.AwaitWithTimeout(absl::Condition(&NoLinkCalls::Check, &wait),
                         options_.peer_timeout + absl::Seconds(5));
  }
  pool_->Join();  // drains queued writer / cleanup tasks; pool_ stays valid
  if (shm_dir_fd_ >= 0) ::close(shm_dir_fd_);
}

absl::Status CheckpointManager::Impl::Recover() {
  const std::string journal = JoinPath(options_.state_dir, "journal");
  ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(journal));
  for (const std::string& n : names) {
    const std::string path = JoinPath(journal, n);
    if (!n.ends_with(".journal")) {
      (void)env_->RemoveFile(path);  // a .tmp of an interrupted step 0a
      continue;
    }
    absl::StatusOr<std::string> text = ReadFileToString(env_, path, 1 << 16);
    if (!text.ok()) {
      recovery_.errors.push_back(fmt::format("{}: {}", path, text.status()));
      continue;
    }
    if (text->empty()) {
      (void)env_->RemoveFile(path);
      continue;
    }
    absl::StatusOr<JournalRecord> rec = DecodeJournal(*text, path);
    // Only a directory under the roots is ever touched (an entry of an
    // earlier version could have been injected through a name).
    if (rec.ok()) {
      absl::StatusOr<std::string> resolved =
          ResolveCheckpointDir(options_.checkpoint_roots, rec->dir);
      if (!resolved.ok() || *resolved != rec->dir) {
        rec = absl::DataLossError(fmt::format(
            "{}: names {}, which is not a checkpoint directory under the roots{}", path,
            absl::CHexEscape(rec->dir),
            resolved.ok() ? "" : fmt::format(" ({})", resolved.status().message())));
      }
    }
    if (!rec.ok()) {
      recovery_.errors.push_back(std::string(rec.status().message()));
      spdlog::error("recovery: journal entry ignored, nothing removed: {}", rec.status());
      continue;  // left for an operator
    }
    const std::string& dir = rec->dir;
    std::optional<std::vector<int>> ranks = rec->ranks;
    if (ranks) std::sort(ranks->begin(), ranks->end());
    if (rec->deleting) {
      spdlog::warn("recovery: finishing the deletion of {} (retention was interrupted)", dir);
    }
    if (!rec->deleting && env_->FileExists(JoinPath(dir, format::kMetadataName)).ok()) {
      recovery_.completed.push_back(dir);
      recovered_commits_.push_back(*rec);
      spdlog::info("recovery: {} was committed before the daemon stopped", dir);
    } else if (absl::Status s = env_->FileExists(dir); absl::IsNotFound(s)) {
      recovery_.removed.push_back(dir);
    } else if (absl::Status del =
                   DeleteCheckpointFiles(env_, options_.checkpoint_roots, dir,
                                         ranks ? &*ranks : nullptr);
               del.ok()) {
      recovery_.removed.push_back(dir);
      spdlog::warn("recovery: removed the unfinished checkpoint {} (no .metadata)", dir);
    } else {
      recovery_.errors.push_back(fmt::format("{}: {}", dir, del));
      spdlog::error("recovery: could not clean up the unfinished checkpoint {}: {}", dir, del);
      continue;  // keep the journal entry: retried at the next start
    }
    (void)env_->RemoveFile(path);
  }
  return env_->SyncDir(journal);
}

void CheckpointManager::Impl::LoadHistory() {
  const std::string dir = JoinPath(options_.state_dir, "history");
  absl::StatusOr<std::vector<std::string>> names = env_->ListDir(dir);
  if (!names.ok()) return;
  absl::MutexLock l(&mu_);
  for (const std::string& n : *names) {
    if (!n.ends_with(".history")) continue;
    const std::string path = JoinPath(dir, n);
    absl::StatusOr<std::string> text = ReadFileToString(env_, path, 64 << 20);
    if (!text.ok()) continue;
    absl::StatusOr<HistoryRecord> rec = DecodeHistory(*text, path);
    if (!rec.ok()) {
      spdlog::error("history ignored (its checkpoints will not be pruned): {}", rec.status());
      continue;
    }
    auto& list = history_[HistoryKey(rec->uid, rec->job)];
    list = std::move(rec->dirs);
  }
}

// ---------------------------------------------------------------------------
// Arenas
// ---------------------------------------------------------------------------

absl::StatusOr<uint64_t> CheckpointManager::Impl::RegisterArena(std::string_view name,
                                                                uint64_t size,
                                                                std::string_view owner,
                                                                int64_t client_pid) {
  {
    absl::MutexLock l(&mu_);
    if (static_cast<int>(arenas_.size()) >= options_.max_arenas) {
      return absl::ResourceExhaustedError(fmt::format(
          "{} arenas are registered already (max_arenas); release unused ones", arenas_.size()));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<shm::Mapping> map,
                   shm::Mapping::Open(shm_dir_fd_, options_.shm_dir, name, size));
  auto entry = std::make_shared<ArenaEntry>();
  entry->map = std::move(map);
  entry->owner = std::string(owner);
  entry->uid = entry->map->owner_uid();
  entry->last_used = clock_();
  absl::MutexLock l(&mu_);
  // The quota of the file's owner (checked once mapped: the owner is known
  // only then; the mapping is dropped on refusal).
  RETURN_IF_ERROR(CheckArenaQuotaLocked(entry->uid, entry->map->size()));
  InsertArenaLocked(entry);
  // Caller credentials: the file's owner uid is kernel-assigned; the pid is
  // the caller's claim, confirmed when /proc/<pid> is visible and has that uid.
  std::string pid_check = "not visible in this pid namespace";
  if (struct stat st; client_pid > 0 &&
                      ::stat(fmt::format("/proc/{}", client_pid).c_str(), &st) == 0) {
    pid_check = st.st_uid == entry->map->owner_uid() ? "verified" : "uid MISMATCH";
  }
  spdlog::info("arena {} registered: '{}' {} bytes by uid={} pid={} ({}), owner '{}'", entry->id,
               EscapeForLog(name), size, entry->map->owner_uid(), client_pid, pid_check,
               EscapeForLog(owner));
  return entry->id;
}

absl::Status CheckpointManager::Impl::CheckArenaQuotaLocked(uint32_t uid, uint64_t size) const {
  if (static_cast<int>(arenas_.size()) >= options_.max_arenas) {
    return absl::ResourceExhaustedError(fmt::format(
        "{} arenas are registered already (max_arenas); release unused ones", arenas_.size()));
  }
  int count = 0;
  uint64_t bytes = 0;
  for (const auto& [id, a] : arenas_) {
    if (a->uid != uid) continue;
    ++count;
    bytes += a->map->size();
  }
  if (count >= options_.max_arenas_per_client) {
    return absl::ResourceExhaustedError(fmt::format(
        "uid {} has {} arenas registered already (max_arenas_per_client = {}); release unused "
        "ones",
        uid, count, options_.max_arenas_per_client));
  }
  if (size > options_.max_arena_bytes_per_client ||
      bytes > options_.max_arena_bytes_per_client - size) {
    return absl::ResourceExhaustedError(fmt::format(
        "uid {} has {} bytes of arenas registered already; {} more would exceed "
        "max_arena_bytes_per_client = {} bytes",
        uid, bytes, size, options_.max_arena_bytes_per_client));
  }
  return absl::OkStatus();
}

void CheckpointManager::Impl::InsertArenaLocked(const std::shared_ptr<ArenaEntry>& entry) {
  do {
    entry->id = absl::Uniform<uint64_t>(arena_ids_);
  } while (entry->id == 0 || arenas_.contains(entry->id));
  arenas_[entry->id] = entry;
}

absl::StatusOr<uint64_t> CheckpointManager::Impl::RegisterArenaFd(
    int fd, uint64_t size, std::string_view owner, const shm::PeerCredentials& peer) {
  shm::OwnedFd owned(fd);
  {
    // Refused before mapping anything when the quota is spent already.
    absl::MutexLock l(&mu_);
    if (absl::Status s = CheckArenaQuotaLocked(peer.uid, size); !s.ok()) return s;
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<shm::Mapping> map,
      shm::Mapping::FromFd(owned.Release(), size,
                           fmt::format("arena of pid {} uid {}", peer.pid, peer.uid)));
  auto entry = std::make_shared<ArenaEntry>();
  entry->map = std::move(map);
  entry->owner = std::string(owner);
  entry->uid = peer.uid;
  entry->verified_uid = true;
  entry->last_used = clock_();
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(CheckArenaQuotaLocked(peer.uid, size));  // a racing registration
  InsertArenaLocked(entry);
  spdlog::info("arena {} registered: 'memfd' {} bytes by uid={} pid={} gid={} (SO_PEERCRED), owner '{}'",
               entry->id, size, peer.uid, peer.pid, peer.gid, EscapeForLog(owner));
  return entry->id;
}

absl::Status CheckpointManager::Impl::ReleaseArena(uint64_t id) {
  Deferred d;
  absl::MutexLock l(&mu_);
  auto it = arenas_.find(id);
  if (it == arenas_.end()) {
    return absl::NotFoundError(fmt::format("arena {} is not registered", id));
  }
  // Checkpoints still holding extents keep the mapping alive (shared_ptr).
  it->second->released = true;
  for (auto& w : it->second->idle_waiters) {
    d.Add([done = std::move(w.done)]() mutable { std::move(done)(absl::OkStatus()); });
  }
  it->second->idle_waiters.clear();
  arenas_.erase(it);
  return absl::OkStatus();
}

uint64_t CheckpointManager::Impl::WaitArenaIdle(uint64_t id, absl::Time deadline,
                                                DoneCallback done) {
  Deferred d;
  absl::MutexLock l(&mu_);
  const uint64_t token = next_token_++;
  auto it = arenas_.find(id);
  if (it == arenas_.end()) {
    d.Add([done = std::move(done), id]() mutable {
      std::move(done)(absl::NotFoundError(fmt::format("arena {} is not registered", id)));
    });
  } else if (it->second->held_bytes == 0) {
    d.Add([done = std::move(done)]() mutable { std::move(done)(absl::OkStatus()); });
  } else {
    it->second->idle_waiters.push_back({token, deadline, std::move(done)});
  }
  return token;
}

void CheckpointManager::Impl::ReleaseExtentLocked(const Extent& e, Deferred& d) {
  if (e.arena == nullptr) return;  // pinned pool or CUDA: `hold` frees it
  ArenaEntry& a = *e.arena;
  a.held_bytes -= e.length;
  a.last_used = clock_();
  if (a.held_bytes == 0) {
    for (auto& w : a.idle_waiters) {
      d.Add([done = std::move(w.done)]() mutable { std::move(done)(absl::OkStatus()); });
    }
    a.idle_waiters.clear();
  }
}

// ---------------------------------------------------------------------------
// Save: validation and staging
// ---------------------------------------------------------------------------

std::shared_ptr<Checkpoint> CheckpointManager::Impl::FindLocked(std::string_view id) {
  auto it = ckpts_.find(std::string(id));
  if (it != ckpts_.end()) return it->second;
  absl::StatusOr<std::string> dir = ResolveCheckpointDir(options_.checkpoint_roots, id);
  if (!dir.ok()) return nullptr;
  it = ckpts_.find(*dir);
  return it == ckpts_.end() ? nullptr : it->second;
}

void CheckpointManager::Impl::ForgetOldestFinishedLocked() {
  size_t settled = 0;
  for (const auto& [dir, c] : ckpts_) settled += c->compacted && c->busy_tasks == 0;
  while (settled >= kMaxFinishedKept) {
    auto oldest = ckpts_.end();
    for (auto it = ckpts_.begin(); it != ckpts_.end(); ++it) {
      const Checkpoint& c = *it->second;
      if (c.compacted && c.busy_tasks == 0 &&
          (oldest == ckpts_.end() || c.seq < oldest->second->seq)) {
        oldest = it;
      }
    }
    if (oldest == ckpts_.end()) return;
    ckpts_.erase(oldest);
    --settled;
  }
}

uint64_t CheckpointManager::Impl::Save(SaveBatch batch, SaveCallback done) {
  Deferred d;
  absl::MutexLock l(&mu_);
  const uint64_t token = next_token_++;
  absl::Status s = SaveLocked(batch, token, done, d);
  if (!s.ok()) {
    spdlog::warn("Save {} rank {} sequence {} rejected: {}", EscapeForLog(batch.checkpoint_id),
                 batch.rank, batch.sequence, EscapeForLog(s.ToString()));
    if (options_.observer != nullptr) options_.observer->SaveRejected(s);
    d.Add([done = std::move(done), s]() mutable { std::move(done)(s); });
  }
  return token;
}

absl::Status CheckpointManager::Impl::RegisterIndexLocked(Checkpoint& c, SaveBatch& batch) {
  RankState& rs = c.ranks[batch.rank];
  if (batch.items.size() != batch.item_nbytes.size()) {
    return absl::InternalError("item sizes and items differ in length");
  }
  if (batch.items.size() > options_.max_items) {
    return absl::ResourceExhaustedError(fmt::format(
        "rank {} sent {} items; the limit is {} (max_items)", batch.rank, batch.items.size(),
        options_.max_items));
  }
  uint64_t total = 0;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const format::ItemDesc& it = batch.items[i];
    const uint64_t nb = batch.item_nbytes[i];
    if (it.fqn.empty()) {
      return absl::InvalidArgumentError(fmt::format("rank {} item {}: empty fqn", batch.rank, i));
    }
    if (it.type == format::ItemDesc::Type::kTensor) {
      const size_t nd = it.global_shape.size();
      if (nd > 64) {
        return absl::InvalidArgumentError(
            fmt::format("item '{}': {} dimensions; the limit is 64", it.fqn, nd));
      }
      if (it.chunk_offsets.size() != nd || it.chunk_sizes.size() != nd) {
        return absl::InvalidArgumentError(fmt::format(
            "item '{}': global_shape has {} dimensions but chunk_offsets {} and chunk_sizes {}",
            it.fqn, nd, it.chunk_offsets.size(), it.chunk_sizes.size()));
      }
      unsigned __int128 numel = 1;
      for (size_t k = 0; k < nd; ++k) {
        const int64_t g = it.global_shape[k], o = it.chunk_offsets[k], z = it.chunk_sizes[k];
        if (g < 0 || o < 0 || z < 0 || o > g || z > g - o) {
          return absl::InvalidArgumentError(fmt::format(
              "item '{}': chunk {} is out of bounds of the global shape {}", it.fqn,
              format::DescribeBox(it.chunk_offsets, it.chunk_sizes),
              format::DescribeBox(std::vector<int64_t>(nd, 0), it.global_shape)));
        }
        numel *= static_cast<uint64_t>(z);
        if (numel > (static_cast<unsigned __int128>(1) << 62)) {
          return absl::InvalidArgumentError(fmt::format("item '{}': chunk too large", it.fqn));
        }
      }
      const unsigned __int128 expect = numel * format::ElementSize(it.dtype);
      if (expect != nb) {
        return absl::InvalidArgumentError(fmt::format(
            "item '{}': nbytes is {} but chunk {} of {} holds {} bytes", it.fqn, nb,
            format::DescribeBox(it.chunk_offsets, it.chunk_sizes), format::DTypeName(it.dtype),
            static_cast<uint64_t>(expect)));
      }
    }
    if (it.type == format::ItemDesc::Type::kBytes && nb == 0) {
      return absl::InvalidArgumentError(fmt::format(
          "rank {} item '{}': an empty bytes item (a bytes item holds a torch.save archive)",
          batch.rank, it.fqn));
    }
    total += nb;
  }
  rs.items = std::move(batch.items);
  rs.nbytes = std::move(batch.item_nbytes);
  rs.total = total;
  rs.indexed = true;
  c.total_bytes += total;
  ++c.ranks_indexed;
  return absl::OkStatus();
}

absl::Status CheckpointManager::Impl::SaveLocked(SaveBatch& batch, uint64_t token,
                                                 SaveCallback& done, Deferred& d) {
  if (stopping_) return absl::UnavailableError("the daemon is shutting down");
  std::sort(batch.cluster.local_ranks.begin(), batch.cluster.local_ranks.end());
  if (batch.world_size < 1 || batch.world_size > options_.max_world_size) {
    return absl::InvalidArgumentError(fmt::format("world_size {} is not in [1, {}]",
                                                  batch.world_size, options_.max_world_size));
  }
  if (batch.rank < 0 || batch.rank >= batch.world_size) {
    return absl::InvalidArgumentError(
        fmt::format("rank {} is not in [0, {})", batch.rank, batch.world_size));
  }
  RETURN_IF_ERROR(ValidateName("checkpoint_id", batch.checkpoint_id, kMaxCheckpointIdBytes));
  RETURN_IF_ERROR(ValidateName("job", batch.job, kMaxJobBytes));
  ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(options_.checkpoint_roots,
                                                         batch.checkpoint_id));
  std::shared_ptr<Checkpoint> c;
  if (auto it = ckpts_.find(dir); it != ckpts_.end() && !IsFinal(it->second->state)) {
    c = it->second;
  } else {
    if (batch.sequence != 0) {
      return absl::FailedPreconditionError(fmt::format(
          "checkpoint {} is not in progress; rank {} sent batch {} without sequence 0", dir,
          batch.rank, batch.sequence));
    }
    int active = 0;
    for (const auto& [k, v] : ckpts_) active += IsFinal(v->state) ? 0 : 1;
    if (active >= options_.max_active_checkpoints) {
      return absl::ResourceExhaustedError(fmt::format(
          "{} checkpoints are in progress already (max_active_checkpoints)", active));
    }
    ForgetOldestFinishedLocked();
    c = std::make_shared<Checkpoint>();
    c->seq = next_seq_++;
    c->dir = dir;
    c->job = batch.job.empty() ? DirName(dir) : batch.job;
    c->world_size = batch.world_size;
    c->overwrite = batch.overwrite;
    c->dedup_lowest = batch.dedup_save_to_lowest_rank;
    c->keep_last_n = batch.keep_last_n;
    c->created = c->last_progress = clock_();
    c->ranks.resize(batch.world_size);
    RETURN_IF_ERROR(ClusterLocked(*c, batch));
    ckpts_[dir] = c;
    if (c->multi) {
      spdlog::info(
          "checkpoint {} (job '{}', ranks [{}] of {} on this node, {} nodes, "
          "coordinator {}) started",
          dir, c->job, fmt::join(c->local, ", "), c->world_size,
          c->cluster.num_nodes,
          c->is_coordinator ? "this node" : c->cluster.coordinator);
    } else {
      spdlog::info("checkpoint {} (job '{}', {} ranks) started", dir, c->job,
                   c->world_size);
    }
  }
  // From here on a bad request fails the checkpoint too: its other ranks
  // cannot complete it.
  auto fail = [&](absl::Status s) {
    FailLocked(c, s, State::kFailed, d);
    return s;
  };
  if (batch.world_size != c->world_size) {
    return fail(absl::InvalidArgumentError(
        fmt::format("rank {} says world_size {} but checkpoint {} has {}", batch.rank,
                    batch.world_size, dir, c->world_size)));
  }
  if (batch.sequence == 0 &&
      (batch.cluster.num_nodes > 1 ? batch.cluster : ClusterSpec{}) !=
          (c->multi ? c->cluster : ClusterSpec{})) {
    return fail(absl::InvalidArgumentError(
        fmt::format("rank {}'s cluster (coordinator, local_ranks, num_nodes) "
                    "differs from that of the "
                    "node's other ranks",
                    batch.rank)));
  }
  if (!std::binary_search(c->local.begin(), c->local.end(), batch.rank)) {
    return fail(absl::InvalidArgumentError(fmt::format(
        "rank {} is not one of this node's ranks [{}] of checkpoint {}",
        batch.rank, fmt::join(c->local, ", "), dir)));
  }
  RankState& rs = c->ranks[batch.rank];
  if (rs.call_token != 0) {
    return fail(absl::FailedPreconditionError(
        fmt::format("rank {} sent a Save while its previous one is in flight", batch.rank)));
  }
  if (batch.sequence != rs.next_sequence || rs.last_received) {
    return fail(absl::InvalidArgumentError(fmt::format(
        "rank {} sent batch {} of checkpoint {}; expected {}", batch.rank, batch.sequence, dir,
        rs.last_received ? "none (its last batch was sent)" : fmt::format("{}", rs.next_sequence))));
  }
  if (batch.sequence == 0) {
    if (batch.overwrite != c->overwrite || batch.dedup_save_to_lowest_rank != c->dedup_lowest ||
        batch.keep_last_n != c->keep_last_n) {
      return fail(absl::InvalidArgumentError(
          fmt::format("rank {}'s save options differ from those of the other ranks", batch.rank)));
    }
    if (absl::Status s = RegisterIndexLocked(*c, batch); !s.ok()) return fail(s);
  } else if (!batch.items.empty()) {
    return fail(absl::InvalidArgumentError(
        fmt::format("rank {} batch {} carries items; only sequence 0 may", batch.rank,
                    batch.sequence)));
  }
  // Extents: arena (or claimed CUDA buffer) bounds and strict index order.
  auto pb = std::make_unique<PendingBatch>();
  if (absl::Status s = CheckCudaBuffersLocked(batch); !s.ok()) return fail(s);
  if (!batch.extents.empty()) {
    std::shared_ptr<ArenaEntry> arena;
    const bool host = std::any_of(batch.extents.begin(), batch.extents.end(),
                                  [](const ExtentRef& e) { return e.cuda_buffer == 0; });
    if (host) {
      auto it = arenas_.find(batch.arena_id);
      if (it == arenas_.end()) {
        return fail(absl::InvalidArgumentError(
            fmt::format("rank {}: arena {} is not registered", batch.rank, batch.arena_id)));
      }
      arena = it->second;
      const int64_t uid = arena->uid;
      if (c->uid == kUnknownUid) {
        c->uid = uid;
      } else if (c->uid != uid && c->uid != kMixedUid) {
        spdlog::warn("checkpoint {}: ranks of uid {} and uid {} save into it; retention will "
                     "not prune for it",
                     dir, c->uid, uid);
        c->uid = kMixedUid;
      }
    }
    uint64_t bytes = 0;
    uint64_t arena_bytes = 0;
    uint32_t item = rs.next_item;
    uint64_t offset = rs.next_offset;
    const uint32_t n = rs.items.size();
    for (const ExtentRef& e : batch.extents) {
      while (item < n && offset == rs.nbytes[item]) {
        ++item;
        offset = 0;
      }
      if (e.length == 0) {
        return fail(absl::InvalidArgumentError(
            fmt::format("rank {}: extent of item {} has length 0", batch.rank, e.item)));
      }
      if (item >= n || e.item != item || e.item_offset != offset) {
        return fail(absl::InvalidArgumentError(fmt::format(
            "rank {}: extent (item {}, offset {}) out of order; expected item {} at offset {}",
            batch.rank, e.item, e.item_offset, item, offset)));
      }
      if (e.length > rs.nbytes[item] - offset) {
        return fail(absl::InvalidArgumentError(fmt::format(
            "rank {}: extent of {} bytes at offset {} overruns item '{}' of {} bytes",
            batch.rank, e.length, offset, rs.items[item].fqn, rs.nbytes[item])));
      }
      if (e.cuda_buffer != 0) {
        if (e.cuda_buffer > batch.cuda_buffers.size()) {
          return fail(absl::InvalidArgumentError(fmt::format(
              "rank {} item '{}': extent names CUDA buffer {} of {}", batch.rank,
              rs.items[item].fqn, e.cuda_buffer, batch.cuda_buffers.size())));
        }
        const uint64_t size = batch.cuda_buffers[e.cuda_buffer - 1].size;
        if (e.arena_offset > size || e.length > size - e.arena_offset) {
          return fail(absl::InvalidArgumentError(fmt::format(
              "rank {} item '{}': range [{}, {}) is outside CUDA buffer {} of {} bytes",
              batch.rank, rs.items[item].fqn, e.arena_offset, e.arena_offset + e.length,
              e.cuda_buffer, size)));
        }
        pb->extents.push_back(
            {nullptr, nullptr, e.arena_offset, e.length, e.item, e.item_offset, {}, e.cuda_buffer});
      } else {
        absl::StatusOr<absl::Span<const char>> span =
            arena->map->Slice(e.arena_offset, e.length);
        if (!span.ok()) {
          return fail(absl::InvalidArgumentError(
              fmt::format("rank {} item '{}': {}", batch.rank, rs.items[item].fqn,
                          span.status().message())));
        }
        pb->extents.push_back(
            {arena, span->data(), e.arena_offset, e.length, e.item, e.item_offset});
        arena_bytes += e.length;
      }
      offset += e.length;
      bytes += e.length;
    }
    if (bytes > options_.max_batch) {
      return fail(absl::ResourceExhaustedError(fmt::format(
          "rank {}: batch of {} bytes exceeds max_batch {}; send smaller batches", batch.rank,
          bytes, options_.max_batch)));
    }
    const uint64_t device_bytes = bytes - arena_bytes;
    if (device_bytes > 0 && stager_->PoolBytesFor(device_bytes) > stager_->pool_bytes()) {
      return fail(absl::ResourceExhaustedError(fmt::format(
          "rank {}: batch of {} device bytes does not fit the pinned staging pool of {} "
          "bytes (pinned_staging_bytes); send smaller batches",
          batch.rank, device_bytes, stager_->pool_bytes())));
    }
    rs.next_item = item;
    rs.next_offset = offset;
    pb->bytes = bytes;
    pb->arena_bytes = arena_bytes;
    pb->device_pending = device_bytes > 0;
    pb->cuda_buffers = std::move(batch.cuda_buffers);
    if (arena != nullptr) {
      arena->held_bytes += arena_bytes;
      arena->last_used = clock_();
    }
  }
  if (batch.last) {
    uint32_t item = rs.next_item;
    uint64_t offset = rs.next_offset;
    while (item < rs.items.size() && offset == rs.nbytes[item]) {
      ++item;
      offset = 0;
    }
    if (item < rs.items.size()) {
      for (const Extent& e : pb->extents) ReleaseExtentLocked(e, d);
      return fail(absl::InvalidArgumentError(fmt::format(
          "rank {} sent its last batch but item '{}' has only {} of {} bytes", batch.rank,
          rs.items[item].fqn, offset, rs.nbytes[item])));
    }
  }
  if (admission_.size() >= static_cast<size_t>(options_.max_pending_saves)) {
    for (const Extent& e : pb->extents) ReleaseExtentLocked(e, d);
    return fail(absl::ResourceExhaustedError(fmt::format(
        "{} Save calls already wait for staging memory (max_pending_saves)", admission_.size())));
  }
  rs.received += pb->bytes;
  rs.awaiting_next_since = absl::InfinitePast();
  rs.last_received = batch.last;
  ++rs.next_sequence;
  rs.call_token = token;
  c->last_progress = clock_();
  save_calls_[token] = {c, batch.rank};
  pb->token = token;
  pb->ckpt = c;
  pb->rank = batch.rank;
  pb->last = batch.last;
  pb->done = std::move(done);
  admission_.push_back(std::move(pb));
  AdmitLocked(d);
  if (c->ranks_indexed == c->num_local && !c->planned && c->busy_tasks == 0 &&
      !IsFinal(c->state)) {
    c->planned = true;  // the plan task owns it now (once it owns the dir)
    StartPlanLocked(c, d);
  }
  return absl::OkStatus();
}

void CheckpointManager::Impl::StartPlanLocked(const std::shared_ptr<Checkpoint>& c,
                                              Deferred& d) {
  DirClaim& claim = dirs_[c->dir];
  if (claim.owner != 0 && claim.owner != c->seq) {
    spdlog::info("checkpoint {}: waiting for an earlier attempt at the directory to finish",
                 c->dir);
    claim.queued.push_back(c);
    ++c->busy_tasks;  // the queued plan: released by ReleaseDirLocked
    return;
  }
  claim.owner = c->seq;
  c->owns_dir = true;
  (void)d;
  SubmitPlanLocked(c);
}

void CheckpointManager::Impl::SubmitPlanLocked(const std::shared_ptr<Checkpoint>& c) {
  if (c->multi) {
    SubmitLocked(c, [this, c]() mutable { RunNodePlan(std::move(c)); });
  } else {
    SubmitLocked(c, [this, c]() mutable { RunPlan(std::move(c)); });
  }
}

void CheckpointManager::Impl::ReleaseDirLocked(const std::shared_ptr<Checkpoint>& c,
                                               Deferred& d) {
  if (!c->owns_dir) return;
  c->owns_dir = false;
  ReleaseDirOwnerLocked(c->dir, c->seq, d);
}

void CheckpointManager::Impl::ReleaseDirOwnerLocked(const std::string& dir, uint64_t owner,
                                                    Deferred& d) {
  auto it = dirs_.find(dir);
  if (it == dirs_.end() || it->second.owner != owner) return;
  DirClaim& claim = it->second;
  claim.owner = 0;
  while (!claim.queued.empty()) {
    std::shared_ptr<Checkpoint> next = std::move(claim.queued.front());
    claim.queued.pop_front();
    --next->busy_tasks;  // its queued plan
    if (IsFinal(next->state)) {
      // Ended while queued: it never touched the directory.
      MaybeCleanupLocked(next, d);
      continue;
    }
    claim.owner = next->seq;
    next->owns_dir = true;
    SubmitPlanLocked(next);
    return;
  }
  dirs_.erase(it);
}

// Adopts waiting batches in arrival order while they fit the budget (one
// batch always fits an idle pool, so a batch up to max_batch progresses).
void CheckpointManager::Impl::AdmitLocked(Deferred& d) {
  while (!admission_.empty()) {
    PendingBatch& pb = *admission_.front();
    if (budget_used_ != 0 && pb.arena_bytes != 0 &&
        budget_used_ + pb.arena_bytes > options_.staging_budget) {
      return;
    }
    std::unique_ptr<PendingBatch> owned = std::move(admission_.front());
    admission_.pop_front();
    budget_used_ += owned->arena_bytes;
    if (owned->device_pending) {
      StageDeviceLocked(std::move(owned), d);
    } else {
      AdoptLocked(*owned, d);
    }
  }
}

void CheckpointManager::Impl::AdoptLocked(PendingBatch& pb, Deferred& d) {
  Checkpoint& c = *pb.ckpt;
  RankState& rs = c.ranks[pb.rank];
  rs.adopted += pb.bytes;
  c.staged_bytes += pb.bytes;
  c.last_progress = clock_();
  for (Extent& e : pb.extents) rs.queue.push_back(std::move(e));
  SaveReply reply{c.dir, State::kStaging, rs.adopted};
  if (pb.last) {
    rs.staged = true;
    rs.call_token = 0;
    save_calls_.erase(pb.token);
    ++c.ranks_staged;
    reply.state = State::kStaged;
    d.Add([done = std::move(pb.done), reply]() mutable { std::move(done)(reply); });
    if (c.ranks_staged == c.num_local) {
      c.staged = clock_();
      if (c.state == State::kStaging || c.state == State::kPending) c.state = State::kWriting;
      spdlog::info("checkpoint {}: all {} {}ranks staged ({} bytes) in {}",
                   c.dir, c.num_local, c.multi ? "local " : "", c.staged_bytes,
                   absl::FormatDuration(c.staged - c.created));
    }
  } else if (pb.arena_bytes == 0) {
    // No arena space to give back (the bytes are in the pinned pool): the
    // next batch may come at once, its copies overlapping this one's writes.
    rs.call_token = 0;
    rs.awaiting_next_since = clock_();
    save_calls_.erase(pb.token);
    d.Add([done = std::move(pb.done), reply]() mutable { std::move(done)(reply); });
  } else {
    rs.consume_target = rs.adopted;
    rs.consume_token = pb.token;
    rs.consume_done = std::move(pb.done);
    if (rs.consumed >= rs.consume_target) {
      rs.call_token = 0;
      rs.awaiting_next_since = clock_();
      save_calls_.erase(pb.token);
      d.Add([done = std::move(rs.consume_done), reply]() mutable { std::move(done)(reply); });
      rs.consume_done = nullptr;
    }
  }
  ScheduleRankLocked(pb.ckpt, pb.rank);
}

void CheckpointManager::Impl::SubmitLocked(const std::shared_ptr<Checkpoint>& c, Task t) {
  if (!pool_->Submit(std::move(t))) {
    // Only after Shutdown joined the pool (a late callback): the task is
    // dropped and the checkpoint was failed by Shutdown.
    spdlog::warn("checkpoint {}: task dropped, the daemon has stopped", c->dir);
    return;
  }
  ++c->busy_tasks;
}

void CheckpointManager::Impl::ScheduleRankLocked(const std::shared_ptr<Checkpoint>& c, int r) {
  RankState& rs = c->ranks[r];
  if (!c->dir_ready || IsFinal(c->state) || rs.busy || rs.done) return;
  if (rs.queue.empty() && !rs.staged) return;
  rs.busy = true;
  SubmitLocked(c, [this, c, r]() mutable { RunRankWriter(std::move(c), r); });
}

// ---------------------------------------------------------------------------
// Staging from CUDA (gpu_stager.h)
// ---------------------------------------------------------------------------

absl::Status CheckpointManager::Impl::CheckCudaBuffersLocked(const SaveBatch& batch) {
  const bool device = !batch.cuda_buffers.empty() ||
                      std::any_of(batch.extents.begin(), batch.extents.end(),
                                  [](const ExtentRef& e) { return e.cuda_buffer != 0; });
  if (!device) return absl::OkStatus();
  if (stager_ == nullptr) {
    return absl::FailedPreconditionError(fmt::format(
        "rank {}: this daemon does not stage CUDA tensors ({}); copy them to host memory "
        "(clients do when GetInfo.cuda_ipc is false)",
        batch.rank, cuda_unavailable_));
  }
  if (batch.cuda_buffers.size() > kMaxCudaBuffers) {
    return absl::ResourceExhaustedError(fmt::format(
        "rank {}: {} CUDA buffers in one batch; at most {}", batch.rank,
        batch.cuda_buffers.size(), kMaxCudaBuffers));
  }
  for (size_t k = 0; k < batch.cuda_buffers.size(); ++k) {
    const CudaBufferDesc& b = batch.cuda_buffers[k];
    if (b.ipc_handle.size() != cuda::kIpcHandleSize) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: CUDA buffer {} has a {}-byte IPC handle; expected {}", batch.rank,
                      k + 1, b.ipc_handle.size(), cuda::kIpcHandleSize));
    }
    if (b.size == 0) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: CUDA buffer {} has size 0", batch.rank, k + 1));
    }
    if (absl::StatusOr<int> dev = stager_->DeviceIndex(b.device); !dev.ok()) {
      return absl::InvalidArgumentError(fmt::format(
          "rank {}: CUDA buffer {}: {} (the trainer must save through its own node's daemon)",
          batch.rank, k + 1, dev.status().message()));
    }
  }
  return absl::OkStatus();
}

void CheckpointManager::Impl::StageDeviceLocked(std::unique_ptr<PendingBatch> pb, Deferred& d) {
  std::shared_ptr<Checkpoint> c = pb->ckpt;
  StageJob job;
  job.what = fmt::format("checkpoint {} rank {}", c->dir, pb->rank);
  job.buffers = pb->cuda_buffers;
  for (const Extent& e : pb->extents) {
    if (e.cuda_buffer != 0) job.copies.push_back({e.cuda_buffer - 1, e.arena_offset, e.length});
  }
  job.cancelled = [this, w = std::weak_ptr<Checkpoint>(c)] {
    std::shared_ptr<Checkpoint> c = w.lock();
    absl::MutexLock l(&mu_);
    return c == nullptr || IsFinal(c->state) || stopping_;
  };
  const uint64_t token = pb->token;
  // Not a busy task: the stager's late answer only looks up the token (the
  // plan waits for busy tasks, and must not wait for staging).
  device_staging_[token] = std::move(pb);
  // The stager may answer at once (shutting down): not under mu_.
  d.Add([this, c, token, job = std::move(job)]() mutable {
    stager_->Stage(std::move(job), [this, c, token](absl::StatusOr<StageResult> r) mutable {
      DeviceStaged(c, token, std::move(r));
    });
  });
}

void CheckpointManager::Impl::DeviceStaged(const std::shared_ptr<Checkpoint>& c, uint64_t token,
                                           absl::StatusOr<StageResult> result) {
  Deferred d;
  absl::MutexLock l(&mu_);
  // Gone: the checkpoint ended meanwhile and FailLocked answered the call.
  if (auto it = device_staging_.find(token); it != device_staging_.end()) {
    std::unique_ptr<PendingBatch> pb = std::move(it->second);
    device_staging_.erase(it);
    if (!result.ok()) {
      budget_used_ -= pb->arena_bytes;
      DropBatchLocked(*pb, result.status(), d);
      FailLocked(c, result.status(), State::kFailed, d);
    } else {
      // The device extents, replaced by the pinned pieces now holding them.
      std::vector<Extent> staged;
      staged.reserve(pb->extents.size());
      size_t k = 0;
      for (Extent& e : pb->extents) {
        if (e.cuda_buffer == 0) {
          staged.push_back(std::move(e));
          continue;
        }
        uint64_t off = e.item_offset;
        for (StagedPiece& piece : (*result)[k++]) {
          staged.push_back(
              {nullptr, piece.data, 0, piece.length, e.item, off, std::move(piece.hold), 0});
          off += piece.length;
        }
      }
      pb->extents = std::move(staged);
      pb->device_pending = false;
      AdoptLocked(*pb, d);
    }
  }
}

void CheckpointManager::Impl::DropBatchLocked(PendingBatch& pb, const absl::Status& error,
                                              Deferred& d) {
  for (const Extent& e : pb.extents) ReleaseExtentLocked(e, d);
  pb.extents.clear();
  save_calls_.erase(pb.token);
  RankState& rs = pb.ckpt->ranks[pb.rank];
  if (rs.call_token == pb.token) rs.call_token = 0;
  d.Add([done = std::move(pb.done), error]() mutable { std::move(done)(error); });
}

// ---------------------------------------------------------------------------
// Planner
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::RunPlan(std::shared_ptr<Checkpoint> c) {
  // The ranks' indexes are complete and no longer change; read them without
  // the lock (only this task touches the plan until dir_ready).
  std::vector<std::vector<format::ItemDesc>> descs(c->world_size);
  {
    absl::MutexLock l(&mu_);
    if (IsFinal(c->state)) {
      // Cancelled or failed before its plan ran: touch nothing on disk.
      Deferred d;
      TaskEndLocked(c, d);
      return;
    }
    for (int r = 0; r < c->world_size; ++r) descs[r] = c->ranks[r].items;
  }
  format::PlanOptions po;
  po.dedup_save_to_lowest_rank = c->dedup_lowest;
  po.max_items = options_.max_items * static_cast<uint64_t>(c->world_size);
  absl::StatusOr<format::SavePlan> plan = format::PlanSave(descs, po);
  absl::Status s = plan.status();
  std::string journal_path;
  bool created_dir = false;
  std::unique_ptr<CheckpointDir> dirh;
  if (s.ok()) {
    s = [&]() -> absl::Status {
      // 0a. The journal entry, durably, before anything in the directory.
      journal_path = NewJournalPath();
      RETURN_IF_ERROR(WriteFileAtomic(env_, journal_path,
                                      EncodeJournal({c->dir, c->job, c->uid, std::nullopt})));
      // 0b. The directory, opened beneath its root (no symlinks), each new
      // component durable in its parent; no stale commit marker.
      ASSIGN_OR_RETURN(dirh, CheckpointDir::Open(env_, options_.checkpoint_roots, c->dir,
                                                 /*create=*/true, &created_dir));
      const std::string marker = JoinPath(dirh->io_path(), format::kMetadataName);
      if (absl::Status e = env_->FileExists(marker); e.ok()) {
        if (!c->overwrite) {
          return absl::FailedPreconditionError(fmt::format(
              "{} already holds a committed checkpoint (save with overwrite to replace it)",
              c->dir));
        }
        if (c->aborted.load()) return absl::CancelledError("cancelled before it replaced " + c->dir);
        RETURN_IF_ERROR(env_->RemoveFile(marker));
        RETURN_IF_ERROR(env_->SyncDir(dirh->io_path()));
      } else if (!absl::IsNotFound(e)) {
        return e;
      }
      return absl::OkStatus();
    }();
  }
  Deferred d;
  absl::MutexLock l(&mu_);
  c->journal_path = journal_path;
  c->created_dir = created_dir;
  if (dirh != nullptr) {
    c->io_dir = dirh->io_path();
    c->dirh = std::move(dirh);
  }
  if (!s.ok() && !IsFinal(c->state)) {
    FailLocked(c, s, State::kFailed, d);
  }
  if (s.ok() && !IsFinal(c->state)) {
    c->plan = *std::move(plan);
    c->infos.resize(c->plan.items.size());
    for (int r = 0; r < c->world_size; ++r) {
      RankWriter& w = c->ranks[r].writer;
      w.plan_index.assign(c->ranks[r].items.size(), -1);
    }
    for (size_t p = 0; p < c->plan.items.size(); ++p) {
      const format::PlannedItem& pi = c->plan.items[p];
      c->ranks[pi.rank].writer.plan_index[pi.item_index] = static_cast<int64_t>(p);
    }
    for (const format::PlannedFile& f : c->plan.files) {
      RankWriter& w = c->ranks[f.rank].writer;
      w.has_file = true;
      w.relative_path = f.relative_path;
      w.path = JoinPath(c->io_dir, f.relative_path);
    }
    c->dir_ready = true;
    if (c->state == State::kPending) {
      c->state =
          c->ranks_staged == c->num_local ? State::kWriting : State::kStaging;
    }
    spdlog::info("checkpoint {}: planned {} items into {} files", c->dir, c->plan.items.size(),
                 c->plan.files.size());
    for (int r = 0; r < c->world_size; ++r) ScheduleRankLocked(c, r);
  }
  TaskEndLocked(c, d);
}

// ---------------------------------------------------------------------------
// Multi-node: planner and commit through the coordinator (cluster.h)
// ---------------------------------------------------------------------------

absl::Status CheckpointManager::Impl::ClusterLocked(Checkpoint& c,
                                                    const SaveBatch& batch) {
  const ClusterSpec& cl = batch.cluster;
  if (cl.num_nodes <= 1) {
    if (!cl.local_ranks.empty() &&
        static_cast<int>(cl.local_ranks.size()) != batch.world_size) {
      return absl::InvalidArgumentError(fmt::format(
          "cluster.local_ranks lists {} of {} ranks but num_nodes is {}",
          cl.local_ranks.size(), batch.world_size, cl.num_nodes));
    }
    c.local.resize(batch.world_size);
    for (int r = 0; r < batch.world_size; ++r) c.local[r] = r;
    c.num_local = batch.world_size;
    return absl::OkStatus();
  }
  if (cl.num_nodes > batch.world_size) {
    return absl::InvalidArgumentError(
        fmt::format("cluster.num_nodes {} exceeds world_size {}", cl.num_nodes,
                    batch.world_size));
  }
  if (cl.local_ranks.empty() || cl.local_ranks.front() < 0 ||
      cl.local_ranks.back() >= batch.world_size ||
      std::adjacent_find(cl.local_ranks.begin(), cl.local_ranks.end()) !=
          cl.local_ranks.end()) {
    return absl::InvalidArgumentError(fmt::format(
        "cluster.local_ranks [{}] must be distinct ranks in [0, {})",
        fmt::join(cl.local_ranks, ", "), batch.world_size));
  }
  c.multi = true;
  c.cluster = cl;
  c.local = cl.local_ranks;
  c.num_local = static_cast<int>(c.local.size());
  c.is_coordinator = c.local.front() == 0;
  if (!options_.link_factory) {
    return absl::FailedPreconditionError(
        "this daemon has no peer service (peer_listen / peer_token_file are "
        "not set), so it "
        "cannot take part in a multi-node checkpoint");
  }
  if (c.is_coordinator) {
    // Non-owning: the coordinator lives as long as the manager.
    c.link = std::shared_ptr<CoordinatorLink>(std::shared_ptr<void>(),
                                              coordinator_.get());
  } else {
    if (cl.coordinator.empty()) {
      return absl::InvalidArgumentError(
          "cluster.coordinator is empty: the peer address of rank 0's daemon "
          "is needed");
    }
    ASSIGN_OR_RETURN(c.link, options_.link_factory(cl.coordinator));
  }
  c.peer_id.checkpoint_id = batch.checkpoint_id;
  c.peer_id.job = batch.job;
  c.peer_id.node = c.local.front();
  c.peer_id.attempt = absl::Uniform<uint64_t>(arena_ids_);
  c.peer_id.node_name = options_.node_name;
  return absl::OkStatus();
}

void CheckpointManager::Impl::RunNodePlan(std::shared_ptr<Checkpoint> c) {
  auto index = std::make_shared<NodeIndex>();
  {
    absl::MutexLock l(&mu_);
    if (IsFinal(c->state)) {
      Deferred d;
      TaskEndLocked(c, d);
      return;
    }
    index->ranks = c->local;
    for (int r : c->local) {
      index->items.push_back(c->ranks[r].items);
      index->nbytes.push_back(c->ranks[r].nbytes);
    }
  }
  // 0a. The journal entry (with the node's ranks: recovery removes only
  // their files), then the shared directory; the coordinator deals with a
  // stale .metadata before answering the plan.
  const std::string journal_path = NewJournalPath();
  absl::Status s = WriteFileAtomic(
      env_, journal_path, EncodeJournal({c->dir, c->job, c->uid, c->local}));
  bool created_dir = false;
  std::unique_ptr<CheckpointDir> dirh;
  if (s.ok()) {
    absl::StatusOr<std::unique_ptr<CheckpointDir>> opened = CheckpointDir::Open(
        env_, options_.checkpoint_roots, c->dir, /*create=*/true, &created_dir);
    if (opened.ok()) {
      dirh = *std::move(opened);
    } else {
      s = opened.status();
    }
  }
  PlanCall call;
  call.id = c->peer_id;
  call.world_size = c->world_size;
  call.num_nodes = c->cluster.num_nodes;
  call.overwrite = c->overwrite;
  call.dedup_save_to_lowest_rank = c->dedup_lowest;
  call.keep_last_n = c->keep_last_n;
  call.index_digest = IndexDigest(*index);
  call.started = c->created;
  call.ranks = c->local;
  for (const auto& items : index->items)
    call.item_counts.push_back(items.size());
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    c->journal_path = journal_path;
    c->created_dir = created_dir;
    if (dirh != nullptr) {
      c->io_dir = dirh->io_path();
      c->dirh = std::move(dirh);
    }
    if (!s.ok() || IsFinal(c->state)) {
      if (!s.ok()) FailLocked(c, s, State::kFailed, d);
      TaskEndLocked(c, d);
      return;
    }
    auto it = sent_digest_.find(SentDigestKey(*c));
    if (it == sent_digest_.end() || it->second != call.index_digest)
      call.index = index;
    c->plan_sent = true;
    c->last_contact = c->last_heartbeat = clock_();
  }
  // The task goes on in the link's callback (busy_tasks stays held).
  if (!call.index) {
    // Digest only; resent with the index if the coordinator lost it.
    PlanCall again = call;
    again.index = index;
    c->link->Plan(std::move(call), [this, c, again = std::move(again)](
                                       absl::StatusOr<NodePlan> plan) mutable {
      if (!plan.ok() && absl::IsFailedPrecondition(plan.status()) &&
          plan.status().message() == kIndexNotCached) {
        spdlog::info(
            "checkpoint {}: the coordinator has no cached index; sending it",
            c->dir);
        SendPlan(c, std::move(again));
        return;
      }
      ApplyNodePlan(c, std::move(plan));
    });
    return;
  }
  SendPlan(c, std::move(call));
}

void CheckpointManager::Impl::SendPlan(std::shared_ptr<Checkpoint> c,
                                       PlanCall call) {
  const uint64_t digest = call.index_digest;
  const std::string key = SentDigestKey(*c);
  c->link->Plan(std::move(call),
                [this, c, digest, key](absl::StatusOr<NodePlan> plan) mutable {
                  if (plan.ok()) {
                    absl::MutexLock l(&mu_);
                    sent_digest_[key] = digest;
                  }
                  ApplyNodePlan(c, std::move(plan));
                });
}

void CheckpointManager::Impl::ApplyNodePlan(
    const std::shared_ptr<Checkpoint>& c, absl::StatusOr<NodePlan> plan) {
  Deferred d;
  absl::MutexLock l(&mu_);
  absl::Status s = plan.status();
  if (s.ok() && plan->ranks.size() != c->local.size()) {
    s = absl::InternalError(
        "the coordinator's plan does not cover this node's ranks");
  }
  if (!s.ok()) {
    if (!IsFinal(c->state)) {
      FailLocked(
          c,
          absl::Status(s.code(),
                       fmt::format("plan round with coordinator {}: {}",
                                   c->is_coordinator ? "(this node)"
                                                     : c->cluster.coordinator,
                                   s.message())),
          State::kFailed, d);
    }
    TaskEndLocked(c, d);
    return;
  }
  if (IsFinal(c->state)) {
    TaskEndLocked(c, d);
    return;
  }
  c->last_contact = clock_();
  // The node's share of the global plan: plan.items / files hold this
  // node's surviving items and files only (rank order, then item order).
  c->plan = format::SavePlan{};
  for (size_t i = 0; i < c->local.size(); ++i) {
    const NodePlan::Rank& pr = plan->ranks[i];
    const int r = c->local[i];
    RankState& rs = c->ranks[r];
    if (pr.rank != r || pr.keep.size() != rs.items.size()) {
      FailLocked(
          c,
          absl::InternalError(fmt::format(
              "the coordinator's plan for rank {} does not match its {} items",
              r, rs.items.size())),
          State::kFailed, d);
      TaskEndLocked(c, d);
      return;
    }
    rs.writer.plan_index.assign(rs.items.size(), -1);
    for (size_t k = 0; k < pr.keep.size(); ++k) {
      if (!pr.keep[k]) continue;
      rs.writer.plan_index[k] = static_cast<int64_t>(c->plan.items.size());
      c->plan.items.push_back({r, k, 0});
    }
    if (!pr.file.empty()) {
      if (pr.file != fmt::format("__{}_0.distcp", r)) {
        FailLocked(
            c,
            absl::InternalError(fmt::format(
                "the coordinator named file '{}' for rank {}", pr.file, r)),
            State::kFailed, d);
        TaskEndLocked(c, d);
        return;
      }
      rs.writer.has_file = true;
      rs.writer.relative_path = pr.file;
      rs.writer.path = JoinPath(c->io_dir, pr.file);
      c->plan.files.push_back({pr.file, r, {}});
    }
  }
  c->infos.resize(c->plan.items.size());
  c->dir_ready = true;
  if (c->state == State::kPending) {
    c->state =
        c->ranks_staged == c->num_local ? State::kWriting : State::kStaging;
  }
  spdlog::info(
      "checkpoint {}: node plan{}: {} items into {} files on this node", c->dir,
      plan->cached ? " (coordinator's plan cache)" : "", c->plan.items.size(),
      c->plan.files.size());
  for (int r : c->local) ScheduleRankLocked(c, r);
  TaskEndLocked(c, d);
}

void CheckpointManager::Impl::RunNodePrepare(std::shared_ptr<Checkpoint> c) {
  // Step 1 was done by the writers. 2. The data files' directory entries.
  absl::Status s = options_.fsync ? env_->SyncDir(c->io_dir) : absl::OkStatus();
  PrepareCall call;
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    if (!s.ok() || IsFinal(c->state)) {
      if (!s.ok()) FailLocked(c, s, State::kFailed, d);
      TaskEndLocked(c, d);
      return;
    }
    call.id = c->peer_id;
    for (int r : c->local) {
      const RankState& rs = c->ranks[r];
      PrepareCall::Rank& pr = call.ranks.emplace_back();
      pr.rank = r;
      for (int64_t p : rs.writer.plan_index) {
        if (p < 0) continue;
        pr.offset.push_back(c->infos[p].offset);
        pr.length.push_back(c->infos[p].length);
      }
    }
    call.progress.state = State::kCommitting;
    call.progress.ranks_staged = c->ranks_staged;
    call.progress.total_bytes = c->total_bytes;
    call.progress.staged_bytes = c->staged_bytes;
    call.progress.written_bytes = c->written_bytes;
    c->prepare_sent = true;
    c->prepare_sent_at = clock_();
    spdlog::info(
        "checkpoint {}: this node's files are durable; prepared, waiting for "
        "the "
        "coordinator's decision",
        c->dir);
  }
  c->link->Prepare(std::move(call), [this, c](absl::StatusOr<GlobalStatus>
                                                  g) mutable {
    if (g.ok()) {
      {
        absl::MutexLock l(&mu_);
        c->global = *g;
      }
      NodeCommitted(c);
      return;
    }
    const absl::Status s = g.status();
    {
      Deferred d;
      absl::MutexLock l(&mu_);
      if (stopping_ && !IsFinal(c->state)) {
        // Shutting down while prepared: the decision may still be commit.
        // Keep the files and the journal entry; recovery at the next start
        // keeps them if .metadata appeared, else removes them.
        c->cleaned = true;
        FailLocked(c,
                   absl::UnavailableError("the daemon shut down while waiting "
                                          "for the coordinator's decision; "
                                          "the next start settles the files"),
                   State::kFailed, d);
      }
      if (IsFinal(c->state)) {
        TaskEndLocked(c, d);
        return;
      }
    }
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
        absl::IsUnknown(s) || absl::IsInternal(s)) {
      // The link failed, not (necessarily) the checkpoint: the coordinator
      // may still commit. The heartbeat loop learns the decision, or decides
      // from .metadata once the coordinator can no longer commit.
      absl::MutexLock l(&mu_);
      c->last_peer_error = s;
      spdlog::warn(
          "checkpoint {}: no answer to prepare ({}); waiting for the decision",
          c->dir, s);
    } else {
      Deferred d;
      absl::MutexLock l(&mu_);
      if (!IsFinal(c->state)) {
        FailLocked(
            c, s, absl::IsCancelled(s) ? State::kCancelled : State::kFailed, d);
      }
    }
    Deferred d;
    absl::MutexLock l(&mu_);
    TaskEndLocked(c, d);
  });
}

void CheckpointManager::Impl::NodeCommitted(
    const std::shared_ptr<Checkpoint>& c) {
  bool committed = false;
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    if (!IsFinal(c->state)) {
      c->state = State::kCommitted;
      c->finished = clock_();
      c->cleaned = true;
      c->global.state = State::kCommitted;
      c->global.nodes_prepared = c->global.nodes_planned = c->cluster.num_nodes;
      committed = true;
      spdlog::info(
          "checkpoint {} committed by coordinator {}: this node wrote {} bytes "
          "in {} "
          "files, {} after its first request",
          c->dir, c->is_coordinator ? "(this node)" : c->cluster.coordinator,
          c->written_bytes, c->plan.files.size(),
          absl::FormatDuration(c->finished - c->created));
      FinishLocked(c, d);
    }
    TaskEndLocked(c, d);
  }
  if (committed) {
    (void)env_->RemoveFile(c->journal_path);  // 6.
    RecordCommitAndRetain(c->job, c->uid, c->dir, c->keep_last_n, /*retain=*/false);
  }
}

void CheckpointManager::Impl::ResolveInDoubt(std::shared_ptr<Checkpoint> c,
                                             absl::Status error) {
  // Committed iff .metadata is there and places this node's items where
  // this node wrote them (the coordinator removed any older .metadata
  // before the plan round ended, so one found now is this checkpoint's).
  bool committed = false;
  absl::StatusOr<std::string> bytes = ReadFileToString(
      env_, JoinPath(c->io_dir.empty() ? c->dir : c->io_dir, format::kMetadataName),
      uint64_t{8} << 30);
  if (bytes.ok()) {
    absl::StatusOr<format::Metadata> md = format::DecodeMetadata(*bytes);
    if (md.ok()) {
      absl::MutexLock l(&mu_);
      committed = true;
      for (int r : c->local) {
        const RankState& rs = c->ranks[r];
        for (size_t i = 0; i < rs.items.size() && committed; ++i) {
          const int64_t p = rs.writer.plan_index[i];
          if (p < 0) continue;
          const format::StorageInfo* info = md->FindStorage(rs.items[i].Key());
          committed = info != nullptr &&
                      info->relative_path == c->infos[p].relative_path &&
                      info->offset == c->infos[p].offset &&
                      info->length == c->infos[p].length;
        }
      }
    }
  }
  if (committed) {
    spdlog::warn(
        "checkpoint {}: the coordinator did not answer ({}), but .metadata "
        "lists this "
        "node's data: committed",
        c->dir, error);
    {
      absl::MutexLock l(&mu_);
      ++c->busy_tasks;  // NodeCommitted ends one task
    }
    NodeCommitted(c);
  } else {
    Deferred d;
    absl::MutexLock l(&mu_);
    if (!IsFinal(c->state)) {
      FailLocked(
          c,
          absl::Status(
              error.code(),
              fmt::format(
                  "no decision from coordinator {} and no .metadata "
                  "naming this node's data: {}",
                  c->is_coordinator ? "(this node)" : c->cluster.coordinator,
                  error.message())),
          State::kFailed, d);
    }
  }
  Deferred d;
  absl::MutexLock l(&mu_);
  TaskEndLocked(c, d);
}

void CheckpointManager::Impl::HeartbeatLocked(
    const std::shared_ptr<Checkpoint>& c, absl::Time now, Deferred& d) {
  const std::string coordinator =
      c->is_coordinator ? "(this node)" : c->cluster.coordinator;
  if (!c->prepare_sent && now - c->last_contact > options_.peer_timeout) {
    FailLocked(c,
               absl::UnavailableError(fmt::format(
                   "coordinator {} was not reachable for {} (peer_timeout){}",
                   coordinator, absl::FormatDuration(now - c->last_contact),
                   c->last_peer_error.ok()
                       ? ""
                       : fmt::format("; last error: {}", c->last_peer_error))),
               State::kFailed, d);
    return;
  }
  // Prepared: silence alone decides nothing until the coordinator can no
  // longer commit (it renames .metadata in only within commit_timeout of
  // every prepare); then .metadata decides.
  if (c->prepare_sent && !c->in_doubt &&
      now - c->last_contact > options_.peer_timeout &&
      now - c->prepare_sent_at >
          options_.commit_timeout + options_.peer_timeout) {
    c->in_doubt = true;
    absl::Status error = absl::UnavailableError(
        fmt::format("no decision from coordinator {} within commit_timeout + "
                    "peer_timeout of this node's "
                    "prepare{}",
                    coordinator,
                    c->last_peer_error.ok()
                        ? ""
                        : fmt::format("; last error: {}", c->last_peer_error)));
    SubmitLocked(
        c, [this, c, error]() mutable { ResolveInDoubt(std::move(c), error); });
    return;
  }
  if (c->in_doubt) return;
  if (c->heartbeat_in_flight ||
      now - c->last_heartbeat < options_.peer_heartbeat)
    return;
  c->heartbeat_in_flight = true;
  c->last_heartbeat = now;
  NodeProgress p;
  p.state = c->state;
  p.ranks_staged = c->ranks_staged;
  p.total_bytes = c->total_bytes;
  p.staged_bytes = c->staged_bytes;
  p.written_bytes = std::max(c->written_bytes, c->written_live.load());
  ++c->busy_tasks;
  std::shared_ptr<CoordinatorLink> link = c->link;
  PeerCallId id = c->peer_id;
  d.Add([this, c, link, id, p]() mutable {
    link->Heartbeat(id, p, [this, c](absl::StatusOr<GlobalStatus> g) {
      Deferred d;
      absl::MutexLock l(&mu_);
      c->heartbeat_in_flight = false;
      if (g.ok()) {
        c->last_contact = clock_();
        c->last_peer_error = absl::OkStatus();
        c->global = *g;
        if ((g->state == State::kFailed || g->state == State::kCancelled) &&
            !IsFinal(c->state)) {
          FailLocked(c,
                     g->error.ok()
                         ? absl::AbortedError("aborted by the coordinator")
                         : g->error,
                     g->state, d);
        } else if (g->state == State::kCommitted && c->prepare_sent &&
                   !IsFinal(c->state) && !c->in_doubt) {
          // The answer to our prepare was lost; the decision was commit.
          c->in_doubt = true;
          ++c->busy_tasks;  // NodeCommitted ends one
          d.Add([this, c] { NodeCommitted(c); });
        }
      } else {
        c->last_peer_error = g.status();
        if (absl::IsNotFound(g.status()) && c->prepare_sent &&
            !IsFinal(c->state) && !c->in_doubt) {
          // The coordinator forgot the checkpoint (it restarted): it will not
          // commit it now; .metadata decides.
          c->in_doubt = true;
          SubmitLocked(c, [this, c, s = g.status()]() mutable {
            ResolveInDoubt(std::move(c), s);
          });
        }
      }
      TaskEndLocked(c, d);
    });
  });
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::Throttle(uint64_t bytes, const std::atomic<bool>& aborted) {
  if (options_.write_rate_limit == 0) return;
  absl::Time start;
  {
    absl::MutexLock l(&throttle_mu_);
    const absl::Time now = absl::Now();
    start = std::max(now, throttle_next_);
    throttle_next_ =
        start + absl::Seconds(static_cast<double>(bytes) / options_.write_rate_limit);
  }
  // In short sleeps, so that an abort is noticed promptly.
  for (absl::Time now = absl::Now(); now < start && !aborted.load(); now = absl::Now()) {
    absl::SleepFor(std::min(start - now, absl::Milliseconds(20)));
  }
}

absl::Status CheckpointManager::Impl::OpenRankFile(Checkpoint& c, int r) {
  RankWriter& w = c.ranks[r].writer;
  if (w.file) return absl::OkStatus();
  if (!w.has_file) {
    return absl::InternalError(fmt::format("rank {} has surviving items but no file", r));
  }
  ASSIGN_OR_RETURN(w.file, env_->NewWritableFile(w.path));
  w.created = true;
  return absl::OkStatus();
}

// Writes the items at the cursor that need no bytes (empty tensors, empty
// bytes items), and the end of the file once every item is done.
absl::Status CheckpointManager::Impl::AdvanceItems(Checkpoint& c, int r) {
  RankState& rs = c.ranks[r];
  RankWriter& w = rs.writer;
  const uint32_t n = rs.items.size();
  while (w.cur_item < n && w.cur_offset == 0 && rs.nbytes[w.cur_item] == 0) {
    const int64_t p = w.plan_index[w.cur_item];
    if (p >= 0) {
      RETURN_IF_ERROR(OpenRankFile(c, r));
      const format::ItemDesc& it = rs.items[w.cur_item];
      format::StorageInfo info{w.relative_path, w.file->Size(), 0, {}};
      if (it.type == format::ItemDesc::Type::kTensor) {
        format::ZipStreamWriter zip(w.file.get());
        RETURN_IF_ERROR(zip.AddRecord("data.pkl", format::TensorDataPickle(it.dtype, it.chunk_sizes)));
        RETURN_IF_ERROR(zip.AddRecord("byteorder", "little"));
        RETURN_IF_ERROR(zip.AddRecord("data/0", ""));
        RETURN_IF_ERROR(zip.AddRecord("version", "3\n"));
        RETURN_IF_ERROR(zip.Finish());
      }
      info.length = w.file->Size() - info.offset;
      c.infos[p] = std::move(info);
    }
    ++w.cur_item;
  }
  if (w.cur_item == n && !w.finished) {
    // 1. The rank's file is complete: fsync and close it.
    if (w.has_file) {
      RETURN_IF_ERROR(OpenRankFile(c, r));  // a rank whose items all moved elsewhere
      if (options_.fsync) RETURN_IF_ERROR(w.file->Sync());
      RETURN_IF_ERROR(w.file->Close());
    }
    w.finished = true;
  }
  return absl::OkStatus();
}

absl::Status CheckpointManager::Impl::Consume(Checkpoint& c, int r, const Extent& e) {
  RankState& rs = c.ranks[r];
  RankWriter& w = rs.writer;
  RETURN_IF_ERROR(AdvanceItems(c, r));
  if (w.cur_item != e.item || w.cur_offset != e.item_offset) {
    return absl::InternalError(fmt::format("rank {}: writer at item {} offset {}, extent at {} {}",
                                           r, w.cur_item, w.cur_offset, e.item, e.item_offset));
  }
  const int64_t p = w.plan_index[e.item];
  const format::ItemDesc& it = rs.items[e.item];
  const uint64_t nb = rs.nbytes[e.item];
  if (p >= 0) {
    RETURN_IF_ERROR(OpenRankFile(c, r));
    if (w.cur_offset == 0) {
      w.item_start = w.file->Size();
      if (it.type == format::ItemDesc::Type::kTensor) {
        w.zip = std::make_unique<format::ZipStreamWriter>(w.file.get());
        RETURN_IF_ERROR(w.zip->AddRecord("data.pkl", format::TensorDataPickle(it.dtype, it.chunk_sizes)));
        RETURN_IF_ERROR(w.zip->AddRecord("byteorder", "little"));
        RETURN_IF_ERROR(w.zip->BeginRecord("data/0", nb));
      }
    }
    // In pieces, so that a cancel or failure stops the writer promptly and
    // the rate limit is smooth.
    constexpr uint64_t kPiece = uint64_t{8} << 20;
    for (uint64_t done = 0; done < e.length;) {
      if (c.aborted.load(std::memory_order_relaxed)) {
        return absl::CancelledError("checkpoint aborted while writing");
      }
      const uint64_t n = std::min(kPiece, e.length - done);
      Throttle(n, c.aborted);
      const std::string_view bytes(e.data + done, n);
      if (w.zip) {
        RETURN_IF_ERROR(w.zip->Append(bytes));
      } else {
        RETURN_IF_ERROR(w.file->Append(bytes));
        const uint64_t at = w.cur_offset + done;
        if (nb <= kMaxBytesItemParse || at < (64 << 10)) {
          w.bytes_item.append(bytes.substr(
              0, nb <= kMaxBytesItemParse ? n : std::min<uint64_t>(n, (64 << 10) - at)));
        }
      }
      done += n;
      c.written_live.fetch_add(n, std::memory_order_relaxed);
    }
  }
  w.cur_offset += e.length;
  if (w.cur_offset == nb) {
    if (p >= 0 && it.type == format::ItemDesc::Type::kBytes) {
      std::string data = std::move(w.bytes_item);
      w.bytes_item.clear();
      RETURN_IF_ERROR(ValidateBytesItem(it.fqn, std::move(data), nb));
    }
    if (p >= 0) {
      if (w.zip) {
        RETURN_IF_ERROR(w.zip->EndRecord());
        RETURN_IF_ERROR(w.zip->AddRecord("version", "3\n"));
        RETURN_IF_ERROR(w.zip->Finish());
        w.zip.reset();
      }
      c.infos[p] = format::StorageInfo{w.relative_path, w.item_start,
                                       w.file->Size() - w.item_start, {}};
    }
    ++w.cur_item;
    w.cur_offset = 0;
  }
  return absl::OkStatus();
}

void CheckpointManager::Impl::RunRankWriter(std::shared_ptr<Checkpoint> c, int r) {
  RankState& rs = c->ranks[r];
  RankWriter& w = rs.writer;
  while (true) {
    std::vector<Extent> work;
    bool staged = false;
    {
      absl::ReleasableMutexLock l(&mu_);
      if (IsFinal(c->state) || (rs.queue.empty() && (!rs.staged || w.finished))) {
        rs.busy = false;
        Deferred d;
        TaskEndLocked(c, d);
        l.Release();
        return;
      }
      work.assign(std::make_move_iterator(rs.queue.begin()),
                  std::make_move_iterator(rs.queue.end()));
      rs.queue.clear();
      staged = rs.staged;
    }
    absl::Status s;
    const uint64_t size_before = w.file ? w.file->Size() : 0;
    size_t done_count = 0;
    for (const Extent& e : work) {
      s = Consume(*c, r, e);
      if (!s.ok()) break;
      if (e.arena != nullptr) e.arena->map->DropPages(e.arena_offset, e.length);
      ++done_count;
    }
    if (s.ok() && staged) s = AdvanceItems(*c, r);
    const uint64_t size_after = w.file ? w.file->Size() : size_before;

    Deferred d;
    absl::MutexLock l(&mu_);
    uint64_t consumed = 0;
    uint64_t arena_consumed = 0;
    for (const Extent& e : work) {
      consumed += e.length;
      if (e.arena != nullptr) arena_consumed += e.length;
      ReleaseExtentLocked(e, d);
    }
    budget_used_ -= arena_consumed;
    rs.consumed += consumed;
    c->written_bytes += size_after - size_before;
    if (rs.consume_done && rs.consumed >= rs.consume_target) {
      save_calls_.erase(rs.consume_token);
      rs.call_token = 0;
      rs.awaiting_next_since = clock_();
      SaveReply reply{c->dir, State::kStaging, rs.adopted};
      d.Add([done = std::move(rs.consume_done), reply]() mutable { std::move(done)(reply); });
      rs.consume_done = nullptr;
    }
    AdmitLocked(d);
    if (!s.ok()) {
      if (!IsFinal(c->state)) FailLocked(c, s, State::kFailed, d);
    } else if (w.finished && !rs.done) {
      rs.done = true;
      if (++c->ranks_done == c->num_local && !IsFinal(c->state)) {
        c->state = State::kCommitting;
        if (c->multi) {
          SubmitLocked(c,
                       [this, c]() mutable { RunNodePrepare(std::move(c)); });
        } else {
          SubmitLocked(c, [this, c]() mutable { RunCommit(std::move(c)); });
        }
      }
    }
    (void)done_count;
  }
}

// ---------------------------------------------------------------------------
// Commit, failure, cleanup
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::RunCommit(std::shared_ptr<Checkpoint> c) {
  // Step 1 was done by the writers: every data file fsynced and closed.
  format::Metadata metadata;
  {
    absl::MutexLock l(&mu_);
    metadata = std::move(c->plan.metadata);
    auto& sd = metadata.storage_data;
    sd.reserve(c->plan.items.size());
    // storage_data in rank order, each rank's items in file order.
    for (int r = 0; r < c->world_size; ++r) {
      const RankState& rs = c->ranks[r];
      for (size_t i = 0; i < rs.items.size(); ++i) {
        const int64_t p = rs.writer.plan_index[i];
        if (p >= 0) sd.emplace_back(rs.items[i].Key(), c->infos[p]);
      }
    }
    // (No BuildIndex: nothing looks items up before encoding.)
  }
  format::StorageMeta sm;
  sm.checkpoint_id = c->dir;
  metadata.storage_meta = sm;
  format::EncodeOptions enc;
  absl::Status s = [&]() -> absl::Status {
    // 2. The data files' directory entries.
    if (options_.fsync) RETURN_IF_ERROR(env_->SyncDir(c->io_dir));
    {
      absl::MutexLock l(&mu_);
      if (IsFinal(c->state)) return absl::OkStatus();  // cancelled meanwhile
    }
    // 3–5. .metadata.tmp → fsync → rename → fsync dir.
    if (options_.fsync) {
      RETURN_IF_ERROR(format::CommitMetadata(env_, c->io_dir, &metadata, enc).status());
    } else {
      // Without fsync still atomic: .metadata.tmp renamed over .metadata.
      ASSIGN_OR_RETURN(std::string bytes, format::EncodeMetadata(metadata, enc));
      const std::string tmp = JoinPath(c->io_dir, std::string(format::kMetadataName) + ".tmp");
      ASSIGN_OR_RETURN(auto f, env_->NewWritableFile(tmp));
      RETURN_IF_ERROR(f->Append(bytes));
      RETURN_IF_ERROR(f->Close());
      RETURN_IF_ERROR(env_->RenameFile(tmp, JoinPath(c->io_dir, format::kMetadataName)));
    }
    return absl::OkStatus();
  }();
  std::string job, dir = c->dir;
  int64_t uid = kUnknownUid;
  bool committed = false;
  {
    // Waiters are answered when this block ends, before retention: deleting
    // old checkpoints can take seconds (file systems mounted with `discard`)
    // and is not part of the commit.
    Deferred d;
    absl::MutexLock l(&mu_);
    if (!s.ok()) {
      // Un-publish: step 0 guaranteed the marker, if any, is ours.
      if (absl::Status u = env_->RemoveFile(JoinPath(c->io_dir, format::kMetadataName));
          !u.ok() && !absl::IsNotFound(u)) {
        spdlog::error("checkpoint {}: could not un-publish .metadata: {}", c->dir, u);
      } else if (options_.fsync) {
        (void)env_->SyncDir(c->io_dir);
      }
      if (!IsFinal(c->state)) FailLocked(c, s, State::kFailed, d);
    } else if (!IsFinal(c->state)) {
      c->state = State::kCommitted;
      c->finished = clock_();
      c->cleaned = true;
      committed = true;
      job = c->job;
      uid = c->uid;
      spdlog::info("checkpoint {} committed: {} bytes in {} files, {} after the first request",
                   c->dir, c->written_bytes, c->plan.files.size(),
                   absl::FormatDuration(c->finished - c->created));
      FinishLocked(c, d);
    }
    TaskEndLocked(c, d);
  }
  if (committed) {
    // 6. The journal entry.
    (void)env_->RemoveFile(c->journal_path);
    RecordCommitAndRetain(job, uid, dir, c->keep_last_n);
  }
}

// Who may prune what: the commit of a checkpoint of job J by Unix user U in
// directory P/name may delete only checkpoints that this daemon recorded as
// committed for the same J by the same U in the same parent P, under the
// checkpoint roots, never the newest one, and none of a user it does not
// know (kUnknownUid: history of earlier versions, or saves without an
// arena).
void CheckpointManager::Impl::RecordCommitAndRetain(const std::string& job, int64_t uid,
                                                    const std::string& dir,
                                                    int keep_last_n,
                                                    bool retain) {
  if (keep_last_n <= 0) keep_last_n = options_.keep_last_n;
  if (!retain || uid < 0) keep_last_n = 0;
  absl::MutexLock io(&history_io_mu_);
  std::vector<std::string> doomed;
  HistoryRecord rec;
  {
    absl::MutexLock l(&mu_);
    auto& list = history_[HistoryKey(uid, job)];
    list.erase(std::remove(list.begin(), list.end(), dir), list.end());
    list.push_back(dir);
    if (keep_last_n > 0) {
      const std::string parent = DirName(dir);
      size_t siblings = 0;
      for (const std::string& d : list) siblings += DirName(d) == parent;
      for (auto it = list.begin(); siblings > static_cast<size_t>(keep_last_n) &&
                                   it != list.end() && *it != dir;) {
        // Never the newest committed: `dir` (list.back()) stays.
        if (DirName(*it) != parent) {
          ++it;
          continue;
        }
        doomed.push_back(*it);
        it = list.erase(it);
        --siblings;
      }
    }
    rec.job = job;
    rec.uid = uid;
    rec.dirs = list;
  }
  const std::string path =
      JoinPath(JoinPath(options_.state_dir, "history"),
               fmt::format("{:016x}.history", Fnv1a(fmt::format("{}\n{}", uid, job))));
  if (absl::Status s = WriteFileAtomic(env_, path, EncodeHistory(rec)); !s.ok()) {
    spdlog::error("could not record the history of job '{}': {}", absl::CHexEscape(job), s);
  }
  for (const std::string& old : doomed) {
    // Only directories under the roots, and only while no attempt at the
    // directory is going: retention owns it while deleting.
    absl::StatusOr<std::string> resolved = ResolveCheckpointDir(options_.checkpoint_roots, old);
    if (!resolved.ok() || *resolved != old) {
      spdlog::error("retention: not deleting {}: not a checkpoint directory under the roots",
                    absl::CHexEscape(old));
      continue;
    }
    {
      absl::MutexLock l(&mu_);
      if (dirs_.contains(old)) continue;  // being written again: not ours
      auto it = ckpts_.find(old);
      if (it != ckpts_.end() && !IsFinal(it->second->state)) continue;
      dirs_[old].owner = kRetentionOwner;
    }
    // Journaled: a crash midway leaves an entry that recovery finishes
    // (else data files without .metadata would stay behind for good).
    const std::string journal = NewJournalPath();
    absl::Status s = WriteFileAtomic(
        env_, journal, EncodeJournal({old, job, uid, std::nullopt, /*deleting=*/true}));
    if (s.ok()) s = DeleteCheckpointFiles(env_, options_.checkpoint_roots, old);
    if (s.ok()) {
      (void)env_->RemoveFile(journal);
      spdlog::info("retention (keep_last_n={}): deleted {}", keep_last_n, old);
    } else {
      spdlog::error("retention: could not delete {}: {}", old, s);
    }
    Deferred d;
    absl::MutexLock l(&mu_);
    if (s.ok()) {
      if (auto it = ckpts_.find(old); it != ckpts_.end() && IsFinal(it->second->state)) {
        ckpts_.erase(it);
      }
    }
    ReleaseDirOwnerLocked(old, kRetentionOwner, d);
  }
}

void CheckpointManager::Impl::FinishLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d) {
  const CheckpointInfo info = InfoOf(*c);
  if (options_.observer != nullptr) options_.observer->CheckpointFinished(info);
  for (auto& w : c->waiters) {
    d.Add([done = std::move(w.done), info]() mutable { std::move(done)(info); });
  }
  c->waiters.clear();
}

void CheckpointManager::Impl::FailLocked(const std::shared_ptr<Checkpoint>& c,
                                         absl::Status error, State state, Deferred& d) {
  if (IsFinal(c->state)) return;
  if (!c->io_dir.empty() && absl::StrContains(error.message(), c->io_dir)) {
    // Errors name the directory as the client knows it, not its fd path.
    error = absl::Status(error.code(),
                         absl::StrReplaceAll(error.message(), {{c->io_dir, c->dir}}));
  }
  c->state = state;
  c->aborted = true;
  c->error = error;
  c->finished = clock_();
  if (state == State::kCancelled) {
    spdlog::warn("checkpoint {} cancelled: {}", c->dir, EscapeForLog(std::string(error.message())));
  } else {
    spdlog::error("checkpoint {} failed: {}", c->dir, EscapeForLog(error.ToString()));
  }
  // Waiting batches and replies.
  for (auto it = admission_.begin(); it != admission_.end();) {
    if ((*it)->ckpt == c) {
      DropBatchLocked(**it, error, d);
      it = admission_.erase(it);
    } else {
      ++it;
    }
  }
  // Batches at the GPU stager (its late answer finds them gone).
  for (auto it = device_staging_.begin(); it != device_staging_.end();) {
    auto next = std::next(it);
    if (it->second->ckpt == c) {
      budget_used_ -= it->second->arena_bytes;
      DropBatchLocked(*it->second, error, d);
      device_staging_.erase(it);
    }
    it = next;
  }
  for (RankState& rs : c->ranks) {
    uint64_t held = 0;
    for (const Extent& e : rs.queue) {
      if (e.arena != nullptr) held += e.length;
      ReleaseExtentLocked(e, d);
    }
    rs.queue.clear();
    budget_used_ -= held;
    if (rs.consume_done) {
      save_calls_.erase(rs.consume_token);
      d.Add([done = std::move(rs.consume_done), error]() mutable { std::move(done)(error); });
      rs.consume_done = nullptr;
    }
    rs.call_token = 0;
  }
  FinishLocked(c, d);
  AdmitLocked(d);
  MaybeCleanupLocked(c, d);  // now, if no task runs for it
  if (c->multi && c->link) {
    // Abort everywhere (the coordinator ignores it if it aborted first).
    ++c->busy_tasks;
    d.Add([this, c, link = c->link, id = c->peer_id, error]() {
      link->Abort(id, error, [this, c](absl::Status) {
        Deferred d;
        absl::MutexLock l(&mu_);
        TaskEndLocked(c, d);
      });
    });
  }
}

// Every task submitted for `c` calls this exactly once, at its end.
void CheckpointManager::Impl::TaskEndLocked(const std::shared_ptr<Checkpoint>& c, Deferred& d) {
  --c->busy_tasks;
  MaybeCleanupLocked(c, d);
}

// The last one out of a final checkpoint settles its directory: a committed
// one (or one whose files are deliberately kept) gives it back at once; a
// failed or cancelled one that owned it removes its files first (after the
// lock is released, on the pool), then gives it back. An attempt that never
// owned its directory touched nothing on disk.
void CheckpointManager::Impl::MaybeCleanupLocked(const std::shared_ptr<Checkpoint>& c,
                                                 Deferred& d) {
  if (c->busy_tasks > 0 || !IsFinal(c->state) || c->cleanup_running) return;
  if (c->state == State::kCommitted || c->cleaned || !c->owns_dir) {
    c->cleaned = true;
    ReleaseDirLocked(c, d);
    Compact(*c);
    return;
  }
  c->cleaned = true;
  c->cleanup_running = true;
  // On the pool (joined by Shutdown, after which Submit runs the task on the
  // calling thread), not under the lock.
  d.Add([this, c] {
    pool_->SubmitOrRun([this, c] {
      RunCleanup(c);
      Deferred d;
      absl::MutexLock l(&mu_);
      c->cleanup_running = false;
      ReleaseDirLocked(c, d);
      Compact(*c);
    });
  });
}

void CheckpointManager::Impl::RunCleanup(std::shared_ptr<Checkpoint> c) {
  std::vector<std::string> files;
  for (RankState& rs : c->ranks) {
    RankWriter& w = rs.writer;
    w.zip.reset();
    w.file.reset();  // closes (status dropped: the file is being removed)
    if (w.created) files.push_back(w.path);
  }
  for (const std::string& f : files) {
    if (absl::Status s = env_->RemoveFile(f); !s.ok() && !absl::IsNotFound(s)) {
      spdlog::error("cleanup of {}: {}", f, s);
    }
  }
  if (!c->io_dir.empty()) {
    (void)env_->RemoveFile(JoinPath(c->io_dir, std::string(format::kMetadataName) + ".tmp"));
  }
  if (c->created_dir && c->dirh != nullptr) (void)c->dirh->RemoveIfEmpty();
  if (!c->journal_path.empty()) (void)env_->RemoveFile(c->journal_path);
  spdlog::info("checkpoint {}: cleaned up ({} data files removed)", c->dir, files.size());
}

// ---------------------------------------------------------------------------
// Queries, cancel, wait, callers going away
// ---------------------------------------------------------------------------

absl::StatusOr<CheckpointInfo> CheckpointManager::Impl::GetStatus(std::string_view id) {
  absl::MutexLock l(&mu_);
  std::shared_ptr<Checkpoint> c = FindLocked(id);
  if (!c) return absl::NotFoundError(fmt::format("no checkpoint '{}' is known", id));
  return InfoOf(*c);
}

std::vector<CheckpointInfo> CheckpointManager::Impl::List(std::string_view job,
                                                          bool include_disk) {
  std::vector<std::pair<uint64_t, CheckpointInfo>> out;
  absl::MutexLock l(&mu_);
  for (const auto& [dir, c] : ckpts_) {
    if (!job.empty() && c->job != job) continue;
    out.emplace_back(c->seq, InfoOf(*c));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CheckpointInfo> result;
  if (include_disk) {
    for (const auto& [key, dirs] : history_) {
      const std::string& j = key.second;
      if (!job.empty() && j != job) continue;
      for (const std::string& d : dirs) {
        if (ckpts_.contains(d)) continue;
        if (!env_->FileExists(JoinPath(d, format::kMetadataName)).ok()) continue;
        CheckpointInfo info;
        info.checkpoint_id = d;
        info.job = j;
        info.state = State::kCommitted;
        info.created = absl::InfinitePast();
        result.push_back(std::move(info));
      }
    }
  }
  for (auto& [seq, info] : out) result.push_back(std::move(info));
  return result;
}

absl::StatusOr<State> CheckpointManager::Impl::Cancel(std::string_view id,
                                                      std::string_view reason) {
  Deferred d;
  absl::MutexLock l(&mu_);
  std::shared_ptr<Checkpoint> c = FindLocked(id);
  if (!c) return absl::NotFoundError(fmt::format("no checkpoint '{}' is known", id));
  if (c->multi && c->prepare_sent && !IsFinal(c->state)) {
    // This node is durable and waits for the decision: ask the coordinator
    // to abort; the answer to the pending Prepare settles the state here.
    spdlog::warn("checkpoint {}: cancel forwarded to the coordinator", c->dir);
    ++c->busy_tasks;
    d.Add([this, c, link = c->link, id = c->peer_id,
           why = std::string(reason.empty()
                                 ? "cancelled by request"
                                 : fmt::format("cancelled: {}", reason))]() {
      link->Abort(id, absl::CancelledError(why), [this, c](absl::Status s) {
        if (!s.ok())
          spdlog::warn("checkpoint {}: the coordinator refused the cancel: {}",
                       c->dir, s);
        Deferred d;
        absl::MutexLock l(&mu_);
        TaskEndLocked(c, d);
      });
    });
    return c->state;
  }
  if (IsFinal(c->state) || c->state == State::kCommitting) {
    return absl::FailedPreconditionError(fmt::format("checkpoint {} is already {}", c->dir,
                                                     StateName(c->state)));
  }
  FailLocked(c,
             absl::CancelledError(reason.empty() ? "cancelled by request"
                                                 : fmt::format("cancelled: {}", reason)),
             State::kCancelled, d);
  return c->state;
}

uint64_t CheckpointManager::Impl::Wait(std::string_view id, absl::Time deadline,
                                       InfoCallback done) {
  Deferred d;
  absl::MutexLock l(&mu_);
  const uint64_t token = next_token_++;
  std::shared_ptr<Checkpoint> c = FindLocked(id);
  if (!c) {
    d.Add([done = std::move(done), id = std::string(id)]() mutable {
      std::move(done)(absl::NotFoundError(fmt::format("no checkpoint '{}' is known", id)));
    });
  } else if (IsFinal(c->state)) {
    d.Add([done = std::move(done), info = InfoOf(*c)]() mutable { std::move(done)(info); });
  } else {
    c->waiters.push_back({token, deadline, std::move(done)});
  }
  return token;
}

void CheckpointManager::Impl::CallerGone(uint64_t token) {
  Deferred d;
  absl::MutexLock l(&mu_);
  if (auto it = save_calls_.find(token); it != save_calls_.end()) {
    std::shared_ptr<Checkpoint> c = it->second.first.lock();
    const int rank = it->second.second;
    if (c && !IsFinal(c->state) && !c->ranks[rank].staged) {
      FailLocked(c,
                 absl::AbortedError(fmt::format(
                     "the client of rank {} went away before its data was staged", rank)),
                 State::kFailed, d);
    }
    return;
  }
  auto drop = [&](auto& waiters) {
    for (auto w = waiters.begin(); w != waiters.end(); ++w) {
      if (w->token == token) {
        d.Add([done = std::move(w->done)]() mutable {
          std::move(done)(absl::CancelledError("the caller went away"));
        });
        waiters.erase(w);
        return true;
      }
    }
    return false;
  };
  for (auto& [id, c] : ckpts_) {
    if (drop(c->waiters)) return;
  }
  for (auto& [id, a] : arenas_) {
    if (drop(a->idle_waiters)) return;
  }
}

void CheckpointManager::Impl::Housekeeping() {
  while (true) {
    Deferred d;
    {
      absl::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100))) return;
      const absl::Time now = clock_();
      std::vector<std::string> forget;
      for (auto& [dir, c] : ckpts_) {
        if (IsFinal(c->state)) {
          if (now - c->finished > options_.forget_after && c->busy_tasks == 0) forget.push_back(dir);
          continue;
        }
        if (c->ranks_staged < c->num_local &&
            now - c->last_progress > options_.stage_timeout) {
          std::string missing;
          int shown = 0;
          for (int r : c->local) {
            if (!c->ranks[r].staged && shown < 16) {
              missing += fmt::format("{}{}", shown++ ? ", " : "", r);
            }
          }
          FailLocked(c,
                     absl::DeadlineExceededError(fmt::format(
                         "ranks [{}] of {} made no progress for {} (stage_timeout)", missing,
                         c->world_size, absl::FormatDuration(options_.stage_timeout))),
                     State::kFailed, d);
          continue;
        }
        if (c->multi && c->plan_sent) {
          HeartbeatLocked(c, now, d);
          if (IsFinal(c->state)) continue;
        }
        int gone = -1;
        for (int r = 0; r < c->world_size; ++r) {
          const RankState& rs = c->ranks[r];
          if (!rs.staged && rs.awaiting_next_since != absl::InfinitePast() &&
              now - rs.awaiting_next_since > options_.batch_gap_timeout) {
            gone = r;
            break;
          }
        }
        if (gone >= 0) {
          FailLocked(c,
                     absl::AbortedError(fmt::format(
                         "the client of rank {} sent no next batch for {} after its previous one "
                         "(batch_gap_timeout): it went away before its data was staged",
                         gone, absl::FormatDuration(options_.batch_gap_timeout))),
                     State::kFailed, d);
          continue;
        }
        for (auto w = c->waiters.begin(); w != c->waiters.end();) {
          if (now >= w->deadline) {
            d.Add([done = std::move(w->done), dir = c->dir]() mutable {
              std::move(done)(absl::DeadlineExceededError(
                  fmt::format("checkpoint {} did not finish in time", dir)));
            });
            w = c->waiters.erase(w);
          } else {
            ++w;
          }
        }
      }
      for (const std::string& dir : forget) ckpts_.erase(dir);
      std::vector<uint64_t> idle;
      for (auto& [id, a] : arenas_) {
        for (auto w = a->idle_waiters.begin(); w != a->idle_waiters.end();) {
          if (now >= w->deadline) {
            d.Add([done = std::move(w->done), id = id]() mutable {
              std::move(done)(absl::DeadlineExceededError(
                  fmt::format("arena {} is still in use by a checkpoint", id)));
            });
            w = a->idle_waiters.erase(w);
          } else {
            ++w;
          }
        }
        if (a->held_bytes == 0 && a->idle_waiters.empty() &&
            now - a->last_used > options_.arena_idle_timeout) {
          idle.push_back(id);
        }
      }
      for (uint64_t id : idle) {
        spdlog::info("arena {} unmapped after {} idle", id,
                     absl::FormatDuration(options_.arena_idle_timeout));
        arenas_.erase(id);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// CheckpointManager
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Create(
    const DaemonOptions& options) {
  if (options.env == nullptr) return absl::InvalidArgumentError("DaemonOptions.env is not set");
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<CheckpointManager>(new CheckpointManager(std::move(impl)));
}

CheckpointManager::CheckpointManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointManager::~CheckpointManager() { impl_->Shutdown(); }

const DaemonOptions& CheckpointManager::options() const { return impl_->options(); }
const RecoveryReport& CheckpointManager::recovery() const { return impl_->recovery(); }
absl::StatusOr<uint64_t> CheckpointManager::RegisterArena(std::string_view name, uint64_t size,
                                                          std::string_view owner,
                                                          int64_t client_pid) {
  return impl_->RegisterArena(name, size, owner, client_pid);
}
absl::StatusOr<uint64_t> CheckpointManager::RegisterArenaFd(int fd, uint64_t size,
                                                            std::string_view owner,
                                                            const shm::PeerCredentials& peer) {
  return impl_->RegisterArenaFd(fd, size, owner, peer);
}
absl::Status CheckpointManager::ReleaseArena(uint64_t id) { return impl_->ReleaseArena(id); }
uint64_t CheckpointManager::WaitArenaIdle(uint64_t id, absl::Time deadline, DoneCallback done) {
  return impl_->WaitArenaIdle(id, deadline, std::move(done));
}
uint64_t CheckpointManager::Save(SaveBatch batch, SaveCallback done) {
  return impl_->Save(std::move(batch), std::move(done));
}
void CheckpointManager::CallerGone(uint64_t token) { impl_->CallerGone(token); }
absl::StatusOr<CheckpointInfo> CheckpointManager::GetStatus(std::string_view id) {
  return impl_->GetStatus(id);
}
std::vector<CheckpointInfo> CheckpointManager::List(std::string_view job, bool include_disk) {
  return impl_->List(job, include_disk);
}
absl::StatusOr<State> CheckpointManager::Cancel(std::string_view id, std::string_view reason) {
  return impl_->Cancel(id, reason);
}
uint64_t CheckpointManager::Wait(std::string_view id, absl::Time deadline, InfoCallback done) {
  return impl_->Wait(id, deadline, std::move(done));
}
uint64_t CheckpointManager::staged_bytes_in_use() const { return impl_->staged_bytes_in_use(); }
int CheckpointManager::arenas_registered() const { return impl_->arenas_registered(); }
CudaInfo CheckpointManager::cuda_info() const { return impl_->cuda_info(); }

CoordinatorLink* CheckpointManager::coordinator() {
  return impl_->coordinator();
}

}  // namespace ckptd::daemon
