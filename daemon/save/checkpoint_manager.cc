// Copyright 2026 The ckptd Authors.
//
// The orchestrator, part 1: start-up and shutdown, queries, cancel, waits
// and the timers (the Save path is in checkpoint_save.cc, the tasks in
// checkpoint_tasks.cc, multi-node in checkpoint_cluster.cc).
// checkpoint_manager_impl.h describes the whole; docs/durability.md numbers
// the durability steps.
#include "daemon/save/checkpoint_manager.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_join.h"
#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/commit/paths.h"
#include "daemon/save/checkpoint_manager_impl.h"
#include "daemon/staging/gpu_stager.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "format/metadata/metadata.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

// Finished checkpoints the daemon remembers for queries (Status, List,
// Wait), besides forget_after; each costs a few hundred bytes once settled.
constexpr size_t kMaxFinishedKept = 4096;

}  // namespace

std::vector<const RankIndex*> Checkpoint::LocalIndexes() const {
  std::vector<const RankIndex*> out;
  out.reserve(local.size());
  for (int r : local) out.push_back(&ranks[r].index);
  return out;
}

std::vector<const RankIndex*> Checkpoint::AllIndexes() const {
  std::vector<const RankIndex*> out;
  out.reserve(ranks.size());
  for (const RankState& r : ranks) out.push_back(&r.index);
  return out;
}

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
  for (const RankState& r : c.ranks) info.items += r.index.items.size();
  info.files = c.planned ? c.plan.plan.files.size() : 0;
  if (c.compacted) {
    info.items = c.items_total;
    info.files = c.files_total;
  }
  if (c.state == State::kCommitted) info.file_bytes = c.written_bytes;
  info.awaiting_metadata = c.awaiting_metadata_since != absl::InfinitePast();
  info.local_ranks = c.num_local;
  info.local_ranks_staged = c.ranks_staged;
  info.local_total_bytes = c.total_bytes;
  info.local_written_bytes = info.written_bytes;
  info.local_staged_bytes = c.staged_bytes;
  if (c.node) {
    const GlobalStatus& g = c.node->global;
    info.num_nodes = c.cluster.num_nodes;
    info.is_coordinator = c.is_coordinator;
    if (!c.is_coordinator) info.coordinator = c.cluster.coordinator;
    info.nodes_planned = g.nodes_planned;
    info.nodes_prepared = g.nodes_prepared;
    // Global figures once the coordinator reported them (never below ours).
    info.ranks_staged = std::max(g.ranks_staged, c.ranks_staged);
    info.total_bytes = std::max(g.total_bytes, c.total_bytes);
    info.staged_bytes = std::max(g.staged_bytes, c.staged_bytes);
    info.written_bytes = std::max(g.written_bytes, info.local_written_bytes);
  }
  return info;
}

void Compact(Checkpoint& c) {
  if (c.compacted) return;
  for (const RankState& r : c.ranks) c.items_total += r.index.items.size();
  c.files_total = c.planned ? c.plan.plan.files.size() : 0;
  std::vector<RankState>().swap(c.ranks);
  c.tier_capture.reset();
  c.plan = WritePlan();
  std::vector<format::StorageInfo>().swap(c.infos);
  c.dirh.reset();  // closes the directory's fds
  c.compacted = true;
}

// ---------------------------------------------------------------------------
// Start-up and shutdown
// ---------------------------------------------------------------------------

CheckpointManager::Impl::Impl(const DaemonOptions& options)
    : options_(options),
      env_(options.env),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      validator_{options.max_world_size, options.max_items, options.max_batch},
      committer_{options.env, options.checkpoint_roots, options.fsync},
      journal_({options.env, JoinPath(options.state_dir, "journal"), clock_}),
      limiter_(options.write_rate_limit, clock_),
      tier_({options.memory_tier_bytes, options.env, clock_}),
      arenas_({options.max_arenas, options.max_arenas_per_client,
               options.max_arena_bytes_per_client, options.arena_idle_timeout,
               clock_}),
      staging_({options.staging_budget,
                static_cast<size_t>(options.max_pending_saves)}) {}

absl::Status CheckpointManager::Impl::Start() {
  RETURN_IF_ERROR(journal_.Init());
  const std::string history_dir = JoinPath(options_.state_dir, "history");
  RETURN_IF_ERROR(CreateDirsDurably(env_, history_dir));
  RETURN_IF_ERROR(env_->CreateDirs(options_.shm_dir));
  shm_dir_fd_ =
      ::open(options_.shm_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (shm_dir_fd_ < 0) {
    return absl::ErrnoToStatus(
        errno, fmt::format("open shm_dir {}", options_.shm_dir));
  }
  ASSIGN_OR_RETURN(
      Recovered recovered,
      RecoverJournal(env_, journal_.dir(), options_.checkpoint_roots));
  recovery_ = std::move(recovered.report);
  {
    absl::MutexLock l(&mu_);
    for (HistoryRecord& rec : LoadHistoryRecords(env_, history_dir)) {
      history_.Load(std::move(rec));
    }
  }
  for (const Recovered::Commit& r : recovered.committed)
    SettleCommit(r.record, r.journal_path);
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
                        absl::Time started, int keep_last_n,
                        int64_t keep_every) {
    // The coordinator's node saves ranks of the checkpoint too: its owner.
    int64_t uid = kUnknownUid;
    {
      absl::MutexLock l(&mu_);
      if (auto it = ckpts_.find(dir); it != ckpts_.end()) uid = it->second->uid;
    }
    SettleCommit(
        {dir, job, uid, std::nullopt, false, absl::ToUnixMillis(started)},
        /*journal_path=*/"", {keep_last_n, keep_every});
  };
  ASSIGN_OR_RETURN(coordinator_, Coordinator::Create(std::move(co)));
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
          ? absl::StatusOr<std::shared_ptr<DeviceBackend>>(
                options_.device_backend)
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
      return absl::FailedPreconditionError(
          fmt::format("cuda=on: {}", cuda_unavailable_));
    }
    spdlog::info("GPU path off (host saves only): {}", cuda_unavailable_);
    return absl::OkStatus();
  }
  stager_ = *std::move(stager);
  return absl::OkStatus();
}

void CheckpointManager::Impl::BeginShutdown(const absl::Status& why) {
  Deferred d;
  absl::MutexLock l(&mu_);
  if (stopping_) return;
  stopping_ = true;
  for (auto& [id, c] : ckpts_) {
    // A commit in progress is let finish (the pool drains in Shutdown).
    if (!IsFinal(c->state) && c->state != State::kCommitting) {
      FailLocked(c, why, State::kFailed, d);
    }
  }
  arenas_.FailWaiters(why, d);
}

void CheckpointManager::Impl::Shutdown() {
  BeginShutdown(absl::UnavailableError("the daemon is shutting down"));
  // Copies in flight finish (their checkpoints failed above: they end their
  // tasks); queued ones are answered CANCELLED.
  if (stager_) stager_->Shutdown();
  if (housekeeper_.joinable()) housekeeper_.join();
  // Answers its nodes' pending calls (this node's included) with the abort.
  if (coordinator_) coordinator_.reset();
  // Link callbacks (remote coordinators) still due: they end their tasks.
  std::vector<std::shared_ptr<CoordinatorLink>> links;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [dir, c] : ckpts_) {
      if (c->node && !c->is_coordinator) links.push_back(c->node->link);
    }
  }
  for (auto& link : links) link->CancelCalls();
  {
    absl::MutexLock l(&mu_);
    auto no_link_calls = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (link_callbacks_ > 0) return false;
      for (const auto& [dir, c] : ckpts_) {
        if (c->multi && c->busy_tasks > 0) return false;
      }
      return true;
    };
    const absl::Duration limit = options_.peer_timeout + absl::Seconds(5);
    if (!mu_.AwaitWithTimeout(absl::Condition(&no_link_calls), limit)) {
      std::vector<std::string> busy;
      for (const auto& [dir, c] : ckpts_) {
        if (c->multi && c->busy_tasks > 0) {
          busy.push_back(fmt::format("{} ({} task(s))", dir, c->busy_tasks));
        }
      }
      spdlog::error(
          "shutdown: multi-node calls still unanswered after {} (peer_timeout "
          "+ 5s): {} link callback(s) pending; checkpoints with busy tasks: "
          "{}; going on",
          absl::FormatDuration(limit), link_callbacks_,
          busy.empty() ? "none" : absl::StrJoin(busy, ", "));
    }
  }
  pool_->Join();  // drains queued writer / cleanup tasks; pool_ stays valid
  if (shm_dir_fd_ >= 0) ::close(shm_dir_fd_);
}

CudaInfo CheckpointManager::Impl::cuda_info() const {
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

std::shared_ptr<Checkpoint> CheckpointManager::Impl::FindLocked(
    std::string_view id, const absl::StatusOr<std::string>& resolved) {
  auto it = ckpts_.find(std::string(id));
  if (it != ckpts_.end()) return it->second;
  if (!resolved.ok()) return nullptr;
  it = ckpts_.find(*resolved);
  return it == ckpts_.end() ? nullptr : it->second;
}

absl::StatusOr<std::string> CheckpointManager::Impl::Resolve(
    std::string_view id) const {
  // realpath is I/O (slow on NFS): never under mu_.
  return ResolveCheckpointDir(options_.checkpoint_roots, id, env_);
}

void CheckpointManager::Impl::ForgetOldestFinishedLocked() {
  size_t settled = 0;
  for (const auto& [dir, c] : ckpts_)
    settled += c->compacted && c->busy_tasks == 0;
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

// ---------------------------------------------------------------------------
// Queries, cancel, wait, callers going away
// ---------------------------------------------------------------------------

absl::StatusOr<CheckpointInfo> CheckpointManager::Impl::GetStatus(
    std::string_view id) {
  const absl::StatusOr<std::string> resolved = Resolve(id);
  absl::MutexLock l(&mu_);
  std::shared_ptr<Checkpoint> c = FindLocked(id, resolved);
  if (!c)
    return absl::NotFoundError(fmt::format("no checkpoint '{}' is known", id));
  CheckpointInfo info = InfoOf(*c);
  info.memory_tier_bytes = tier_.HeldBytes(info.checkpoint_id);
  return info;
}

std::vector<CheckpointInfo> CheckpointManager::Impl::List(std::string_view job,
                                                          bool include_disk) {
  std::vector<std::pair<uint64_t, CheckpointInfo>> live;
  std::vector<std::pair<std::string, std::string>> recorded;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [dir, c] : ckpts_) {
      if (!job.empty() && c->job != job) continue;
      live.emplace_back(c->seq, InfoOf(*c));
    }
    if (include_disk) {
      for (auto& [j, d] : history_.Committed(job)) {
        if (!ckpts_.contains(d))
          recorded.emplace_back(std::move(j), std::move(d));
      }
    }
  }
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CheckpointInfo> result;
  // Outside the lock: one FileExists per recorded checkpoint (NFS).
  for (auto& [j, d] : recorded) {
    if (!env_->FileExists(JoinPath(d, format::kMetadataName)).ok()) continue;
    CheckpointInfo info;
    info.checkpoint_id = std::move(d);
    info.job = std::move(j);
    info.state = State::kCommitted;
    info.created = absl::InfinitePast();
    result.push_back(std::move(info));
  }
  for (auto& [seq, info] : live) result.push_back(std::move(info));
  if (tier_.enabled()) {
    for (CheckpointInfo& info : result)
      info.memory_tier_bytes = tier_.HeldBytes(info.checkpoint_id);
  }
  return result;
}

absl::StatusOr<State> CheckpointManager::Impl::Cancel(std::string_view id,
                                                      std::string_view reason) {
  const absl::StatusOr<std::string> resolved = Resolve(id);
  Deferred d;
  absl::MutexLock l(&mu_);
  std::shared_ptr<Checkpoint> c = FindLocked(id, resolved);
  if (!c)
    return absl::NotFoundError(fmt::format("no checkpoint '{}' is known", id));
  const std::string why = reason.empty() ? "cancelled by request"
                                         : fmt::format("cancelled: {}", reason);
  if (c->node && c->node->prepare_sent && !IsFinal(c->state)) {
    // This node is durable and waits for the decision: ask the coordinator
    // to abort; the answer to the pending Prepare settles the state here.
    spdlog::warn("checkpoint {}: cancel forwarded to the coordinator", c->dir);
    AbortAtCoordinatorLocked(c, absl::CancelledError(why), d);
    return c->state;
  }
  // A checkpoint awaiting DCP's .metadata (external_metadata) commits
  // nothing until it is handed over: it may still be cancelled.
  const bool awaiting = c->awaiting_metadata_since != absl::InfinitePast();
  if (IsFinal(c->state) || (c->state == State::kCommitting && !awaiting)) {
    return absl::FailedPreconditionError(fmt::format(
        "checkpoint {} is already {}", c->dir, StateName(c->state)));
  }
  FailLocked(c, absl::CancelledError(why), State::kCancelled, d);
  return c->state;
}

uint64_t CheckpointManager::Impl::Wait(std::string_view id, absl::Time deadline,
                                       InfoCallback done,
                                       bool until_data_durable) {
  const absl::StatusOr<std::string> resolved = Resolve(id);
  Deferred d;
  absl::MutexLock l(&mu_);
  const uint64_t token = next_token_++;
  std::shared_ptr<Checkpoint> c = FindLocked(id, resolved);
  if (!c) {
    d.Add([done = std::move(done), id = std::string(id)]() mutable {
      std::move(done)(
          absl::NotFoundError(fmt::format("no checkpoint '{}' is known", id)));
    });
  } else if (IsFinal(c->state) ||
             (until_data_durable &&
              c->awaiting_metadata_since != absl::InfinitePast())) {
    d.Add([done = std::move(done), info = InfoOf(*c)]() mutable {
      std::move(done)(info);
    });
  } else {
    c->waiters.push_back(
        {token, deadline, std::move(done), until_data_durable});
    spdlog::debug("Wait on {}: {} waiter(s)", c->dir, c->waiters.size());
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
      FailLocked(
          c,
          absl::AbortedError(fmt::format(
              "the client of rank {} went away before its data was staged",
              rank)),
          State::kFailed, d);
    }
    return;
  }
  for (auto& [id, c] : ckpts_) {
    for (auto w = c->waiters.begin(); w != c->waiters.end(); ++w) {
      if (w->token != token) continue;
      d.Add([done = std::move(w->done)]() mutable {
        std::move(done)(absl::CancelledError("the caller went away"));
      });
      c->waiters.erase(w);
      return;
    }
  }
  arenas_.DropWaiter(token, d);
}

uint64_t CheckpointManager::Impl::staged_bytes_in_use() const {
  absl::MutexLock l(&mu_);
  return staging_.used();
}

int CheckpointManager::Impl::arenas_registered() const {
  absl::MutexLock l(&mu_);
  return arenas_.size();
}

// ---------------------------------------------------------------------------
// Timers
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::Housekeeping() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                               absl::Milliseconds(100)))
        return;
    }
    Tick(clock_->Now());
  }
}

void CheckpointManager::Impl::Tick(absl::Time now) {
  Deferred d;
  absl::MutexLock l(&mu_);
  std::vector<std::string> forget;
  for (auto& [dir, c] : ckpts_) {
    if (IsFinal(c->state)) {
      if (now - c->finished > options_.forget_after && c->busy_tasks == 0)
        forget.push_back(dir);
      continue;
    }
    TickCheckpointLocked(c, now, d);
  }
  for (const std::string& dir : forget) ckpts_.erase(dir);
  arenas_.Expire(now, d);
}

void CheckpointManager::Impl::TickCheckpointLocked(
    const std::shared_ptr<Checkpoint>& c, absl::Time now, Deferred& d) {
  if (c->ranks_staged < c->num_local &&
      now - c->last_progress > options_.stage_timeout) {
    std::vector<int> missing;
    for (int r : c->local) {
      if (!c->ranks[r].staged) missing.push_back(r);
    }
    FailLocked(c,
               absl::DeadlineExceededError(fmt::format(
                   "ranks [{}] of {} made no progress for {} (stage_timeout)",
                   FormatRanks(missing), c->world_size,
                   absl::FormatDuration(options_.stage_timeout))),
               State::kFailed, d);
    return;
  }
  if (c->node && c->node->plan_sent) {
    HeartbeatLocked(c, now, d);
    if (IsFinal(c->state)) return;
  }
  TickMetadataLocked(c, now, d);
  if (IsFinal(c->state)) return;
  for (int r = 0; r < c->world_size; ++r) {
    const RankState& rs = c->ranks[r];
    if (!rs.staged && rs.awaiting_next_since != absl::InfinitePast() &&
        now - rs.awaiting_next_since > options_.batch_gap_timeout) {
      FailLocked(
          c,
          absl::AbortedError(fmt::format(
              "the client of rank {} sent no next batch for {} after its "
              "previous one "
              "(batch_gap_timeout): it went away before its data was staged",
              r, absl::FormatDuration(options_.batch_gap_timeout))),
          State::kFailed, d);
      return;
    }
  }
  for (auto w = c->waiters.begin(); w != c->waiters.end();) {
    if (now < w->deadline) {
      ++w;
      continue;
    }
    d.Add([done = std::move(w->done), dir = c->dir]() mutable {
      std::move(done)(absl::DeadlineExceededError(
          fmt::format("checkpoint {} did not finish in time", dir)));
    });
    w = c->waiters.erase(w);
  }
}

// ---------------------------------------------------------------------------
// CheckpointManager
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Create(
    const DaemonOptions& options) {
  if (options.env == nullptr)
    return absl::InvalidArgumentError("DaemonOptions.env is not set");
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<CheckpointManager>(
      new CheckpointManager(std::move(impl)));
}

CheckpointManager::CheckpointManager(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CheckpointManager::~CheckpointManager() { impl_->Shutdown(); }
void CheckpointManager::BeginShutdown(const absl::Status& why) {
  impl_->BeginShutdown(why);
}

const DaemonOptions& CheckpointManager::options() const {
  return impl_->options();
}
const RecoveryReport& CheckpointManager::recovery() const {
  return impl_->recovery();
}
absl::StatusOr<uint64_t> CheckpointManager::RegisterArena(
    std::string_view name, uint64_t size, std::string_view owner,
    int64_t client_pid) {
  return impl_->RegisterArena(name, size, owner, client_pid);
}
absl::StatusOr<uint64_t> CheckpointManager::RegisterArenaFd(
    int fd, uint64_t size, std::string_view owner,
    const shm::PeerCredentials& peer) {
  return impl_->RegisterArenaFd(fd, size, owner, peer);
}
absl::Status CheckpointManager::ReleaseArena(uint64_t id) {
  return impl_->ReleaseArena(id);
}

std::shared_ptr<const Arena> CheckpointManager::FindArena(uint64_t id) {
  return impl_->FindArena(id);
}
uint64_t CheckpointManager::WaitArenaIdle(uint64_t id, absl::Time deadline,
                                          DoneCallback done) {
  return impl_->WaitArenaIdle(id, deadline, std::move(done));
}
uint64_t CheckpointManager::Save(SaveBatch batch, SaveCallback done) {
  return impl_->Save(std::move(batch), std::move(done));
}
void CheckpointManager::CallerGone(uint64_t token) { impl_->CallerGone(token); }
absl::StatusOr<CheckpointInfo> CheckpointManager::GetStatus(
    std::string_view id) {
  return impl_->GetStatus(id);
}
std::vector<CheckpointInfo> CheckpointManager::List(std::string_view job,
                                                    bool include_disk) {
  return impl_->List(job, include_disk);
}
absl::StatusOr<State> CheckpointManager::Cancel(std::string_view id,
                                                std::string_view reason) {
  return impl_->Cancel(id, reason);
}
uint64_t CheckpointManager::Wait(std::string_view id, absl::Time deadline,
                                 InfoCallback done, bool until_data_durable) {
  return impl_->Wait(id, deadline, std::move(done), until_data_durable);
}
absl::StatusOr<Layout> CheckpointManager::GetLayout(std::string_view id,
                                                    uint64_t arena_id) {
  return impl_->GetLayout(id, arena_id);
}
absl::Status CheckpointManager::CommitMetadata(std::string_view id,
                                               uint64_t arena_id,
                                               std::string metadata) {
  return impl_->CommitMetadata(id, arena_id, std::move(metadata));
}
void CheckpointManager::TickForTest(absl::Time now) { impl_->Tick(now); }
uint64_t CheckpointManager::staged_bytes_in_use() const {
  return impl_->staged_bytes_in_use();
}
int CheckpointManager::arenas_registered() const {
  return impl_->arenas_registered();
}
CudaInfo CheckpointManager::cuda_info() const { return impl_->cuda_info(); }
MemoryTier* CheckpointManager::memory_tier() { return impl_->memory_tier(); }
CoordinatorLink* CheckpointManager::coordinator() {
  return impl_->coordinator();
}

}  // namespace ckptd::daemon
