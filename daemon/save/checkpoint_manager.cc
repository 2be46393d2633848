// Copyright 2026 The ckptd Authors.
//
// CheckpointManager, the facade of the save orchestrator: its public API
// (checkpoint_manager.h), the queries (Status, List, Wait, the counters),
// Cancel, callers going away, and the arenas. A Save goes on in intake.h;
// save_core.h lists the parts and what they share.
#include "daemon/save/checkpoint_manager.h"

#include <algorithm>
#include <utility>

#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/save/attempt.h"
#include "daemon/save/cluster_link.h"
#include "daemon/save/external_commit.h"
#include "daemon/save/intake.h"
#include "daemon/save/save_core.h"
#include "fmt/format.h"
#include "format/metadata/metadata.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

using save::Checkpoint;
using save::SaveCore;

// ---------------------------------------------------------------------------
// Start-up and shutdown
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Create(
    const DaemonOptions& options) {
  if (options.env == nullptr)
    return absl::InvalidArgumentError("DaemonOptions.env is not set");
  auto core = std::make_unique<SaveCore>(options);
  RETURN_IF_ERROR(save::Start(*core));
  return std::unique_ptr<CheckpointManager>(
      new CheckpointManager(std::move(core)));
}

CheckpointManager::CheckpointManager(std::unique_ptr<SaveCore> core)
    : core_(std::move(core)) {}

CheckpointManager::~CheckpointManager() { save::Shutdown(*core_); }

void CheckpointManager::BeginShutdown(const absl::Status& why) {
  save::BeginShutdown(*core_, why);
}

const DaemonOptions& CheckpointManager::options() const {
  return core_->options;
}

const RecoveryReport& CheckpointManager::recovery() const {
  return core_->recovery;
}

// ---------------------------------------------------------------------------
// Arenas (arena/arena_registry.h)
// ---------------------------------------------------------------------------

absl::StatusOr<uint64_t> CheckpointManager::RegisterArena(
    std::string_view name, uint64_t size, std::string_view owner,
    int64_t client_pid) {
  SaveCore& core = *core_;
  {
    absl::MutexLock l(&core.mu);
    if (core.arenas.size() >= core.options.max_arenas) {
      return absl::ResourceExhaustedError(fmt::format(
          "{} arenas are registered already (max_arenas); release unused ones",
          core.arenas.size()));
    }
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<Arena> arena,
      ArenaRegistry::MapNamed(core.shm_dir_fd, core.options.shm_dir, name, size,
                              owner, client_pid));
  absl::MutexLock l(&core.mu);
  // The quota of the file's owner (known only once mapped; the mapping is
  // dropped on refusal).
  RETURN_IF_ERROR(core.arenas.CheckQuota(arena->uid, arena->map->size()));
  const uint64_t id = core.arenas.Insert(arena);
  spdlog::info("arena {} registered: '{}' {} bytes of uid={}, owner '{}'", id,
               EscapeForLog(name), size, arena->uid, EscapeForLog(owner));
  return id;
}

absl::StatusOr<uint64_t> CheckpointManager::RegisterArenaFd(
    int fd, uint64_t size, std::string_view owner,
    const shm::PeerCredentials& peer) {
  SaveCore& core = *core_;
  shm::OwnedFd owned(fd);
  {
    // Refused before mapping anything when the quota is spent already.
    absl::MutexLock l(&core.mu);
    RETURN_IF_ERROR(core.arenas.CheckQuota(peer.uid, size));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Arena> arena,
                   ArenaRegistry::MapFd(owned.Release(), size, owner, peer));
  absl::MutexLock l(&core.mu);
  RETURN_IF_ERROR(
      core.arenas.CheckQuota(peer.uid, size));  // a racing registration
  const uint64_t id = core.arenas.Insert(arena);
  spdlog::info(
      "arena {} registered: 'memfd' {} bytes by uid={} pid={} gid={} "
      "(SO_PEERCRED), owner '{}'",
      id, size, peer.uid, peer.pid, peer.gid, EscapeForLog(owner));
  return id;
}

absl::Status CheckpointManager::ReleaseArena(uint64_t id) {
  SaveCore& core = *core_;
  Deferred d;
  absl::MutexLock l(&core.mu);
  return core.arenas.Release(id, d);
}

uint64_t CheckpointManager::WaitArenaIdle(uint64_t id, absl::Time deadline,
                                          DoneCallback done) {
  SaveCore& core = *core_;
  Deferred d;
  absl::MutexLock l(&core.mu);
  const uint64_t token = core.next_token++;
  core.arenas.WaitIdle(id, token, deadline, std::move(done), d);
  return token;
}

std::shared_ptr<const Arena> CheckpointManager::FindArena(uint64_t id) {
  return save::FindArena(*core_, id);
}

// ---------------------------------------------------------------------------
// Saves (intake.h, external_commit.h)
// ---------------------------------------------------------------------------

uint64_t CheckpointManager::Save(SaveBatch batch, SaveCallback done) {
  return save::intake::Save(*core_, std::move(batch), std::move(done));
}

absl::StatusOr<Layout> CheckpointManager::GetLayout(std::string_view id,
                                                    uint64_t arena_id) {
  return save::external_commit::GetLayout(*core_, id, arena_id);
}

absl::Status CheckpointManager::CommitMetadata(std::string_view id,
                                               uint64_t arena_id,
                                               std::string metadata) {
  return save::external_commit::CommitMetadata(*core_, id, arena_id,
                                               std::move(metadata));
}

// ---------------------------------------------------------------------------
// Queries, cancel, wait, callers going away
// ---------------------------------------------------------------------------

namespace {

// What the memory tiers hold of the checkpoint: here, and its replicas.
void AddHeld(SaveCore& core, CheckpointInfo& info) {
  info.memory_tier_bytes = core.tier.HeldBytes(info.checkpoint_id);
  if (core.shares != nullptr)
    info.replica_holders = core.shares->HoldersOf(info.checkpoint_id);
  for (const TierHeld& h : core.tier.List()) {
    if (h.dir == info.checkpoint_id && !h.replica_of.empty()) {
      info.replicas_held.push_back(
          fmt::format("node {} ({})", h.replica_node, h.replica_of));
    }
  }
}

}  // namespace

absl::StatusOr<CheckpointInfo> CheckpointManager::GetStatus(
    std::string_view id) {
  SaveCore& core = *core_;
  const absl::StatusOr<std::string> resolved = save::Resolve(core, id);
  CheckpointInfo info;
  {
    absl::MutexLock l(&core.mu);
    std::shared_ptr<Checkpoint> c = save::FindLocked(core, id, resolved);
    if (!c) {
      return absl::NotFoundError(
          fmt::format("no checkpoint '{}' is known", id));
    }
    info = save::attempt::InfoOf(*c);
  }
  AddHeld(core, info);
  return info;
}

std::vector<CheckpointInfo> CheckpointManager::List(std::string_view job,
                                                    bool include_disk) {
  SaveCore& core = *core_;
  std::vector<std::pair<uint64_t, CheckpointInfo>> live;
  std::vector<std::pair<std::string, std::string>> recorded;
  {
    absl::MutexLock l(&core.mu);
    for (const auto& [dir, c] : core.ckpts) {
      if (!job.empty() && c->job != job) continue;
      live.emplace_back(c->seq, save::attempt::InfoOf(*c));
    }
    if (include_disk) {
      for (auto& [j, d] : core.history.Committed(job)) {
        if (!core.ckpts.contains(d))
          recorded.emplace_back(std::move(j), std::move(d));
      }
    }
  }
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CheckpointInfo> result;
  // Outside the lock: one FileExists per recorded checkpoint (NFS).
  for (auto& [j, d] : recorded) {
    if (!core.env->FileExists(JoinPath(d, format::kMetadataName)).ok())
      continue;
    CheckpointInfo info;
    info.checkpoint_id = std::move(d);
    info.job = std::move(j);
    info.state = State::kCommitted;
    info.created = absl::InfinitePast();
    result.push_back(std::move(info));
  }
  for (auto& [seq, info] : live) result.push_back(std::move(info));
  if (core.tier.enabled()) {
    for (CheckpointInfo& info : result) AddHeld(core, info);
  }
  return result;
}

absl::StatusOr<State> CheckpointManager::Cancel(std::string_view id,
                                                std::string_view reason) {
  SaveCore& core = *core_;
  const absl::StatusOr<std::string> resolved = save::Resolve(core, id);
  Deferred d;
  absl::MutexLock l(&core.mu);
  std::shared_ptr<Checkpoint> c = save::FindLocked(core, id, resolved);
  if (!c)
    return absl::NotFoundError(fmt::format("no checkpoint '{}' is known", id));
  const std::string why = reason.empty() ? "cancelled by request"
                                         : fmt::format("cancelled: {}", reason);
  if (c->node && c->node->prepare_sent && !IsFinal(c->state)) {
    // This node is durable and waits for the decision: ask the coordinator
    // to abort; the answer to the pending Prepare settles the state here.
    spdlog::warn("checkpoint {}: cancel forwarded to the coordinator", c->dir);
    save::cluster_link::AbortAtCoordinatorLocked(core, c,
                                                 absl::CancelledError(why), d);
    return c->state;
  }
  // A checkpoint awaiting DCP's .metadata (external_metadata) commits
  // nothing until it is handed over: it may still be cancelled.
  const bool awaiting = c->awaiting_metadata_since != absl::InfinitePast();
  if (IsFinal(c->state) || (c->state == State::kCommitting && !awaiting)) {
    return absl::FailedPreconditionError(fmt::format(
        "checkpoint {} is already {}", c->dir, StateName(c->state)));
  }
  save::attempt::FailLocked(core, c, absl::CancelledError(why),
                            State::kCancelled, d);
  return c->state;
}

uint64_t CheckpointManager::Wait(std::string_view id, absl::Time deadline,
                                 InfoCallback done, bool until_data_durable) {
  SaveCore& core = *core_;
  const absl::StatusOr<std::string> resolved = save::Resolve(core, id);
  Deferred d;
  absl::MutexLock l(&core.mu);
  const uint64_t token = core.next_token++;
  std::shared_ptr<Checkpoint> c = save::FindLocked(core, id, resolved);
  if (!c) {
    d.Add([done = std::move(done), id = std::string(id)]() mutable {
      std::move(done)(
          absl::NotFoundError(fmt::format("no checkpoint '{}' is known", id)));
    });
  } else if (IsFinal(c->state) ||
             (until_data_durable &&
              c->awaiting_metadata_since != absl::InfinitePast())) {
    d.Add([done = std::move(done), info = save::attempt::InfoOf(*c)]() mutable {
      std::move(done)(info);
    });
  } else {
    c->waiters.push_back(
        {token, deadline, std::move(done), until_data_durable});
    spdlog::debug("Wait on {}: {} waiter(s)", c->dir, c->waiters.size());
  }
  return token;
}

void CheckpointManager::CallerGone(uint64_t token) {
  SaveCore& core = *core_;
  Deferred d;
  absl::MutexLock l(&core.mu);
  if (auto it = core.save_calls.find(token); it != core.save_calls.end()) {
    std::shared_ptr<Checkpoint> c = it->second.first.lock();
    const int rank = it->second.second;
    if (c && !IsFinal(c->state) && !c->ranks[rank].staged) {
      save::attempt::FailLocked(
          core, c,
          absl::AbortedError(fmt::format(
              "the client of rank {} went away before its data was staged",
              rank)),
          State::kFailed, d);
    }
    return;
  }
  for (auto& [id, c] : core.ckpts) {
    for (auto w = c->waiters.begin(); w != c->waiters.end(); ++w) {
      if (w->token != token) continue;
      d.Add([done = std::move(w->done)]() mutable {
        std::move(done)(absl::CancelledError("the caller went away"));
      });
      c->waiters.erase(w);
      return;
    }
  }
  core.arenas.DropWaiter(token, d);
}

uint64_t CheckpointManager::staged_bytes_in_use() const {
  const SaveCore& core = *core_;
  absl::MutexLock l(&core.mu);
  return core.staging.used();
}

int CheckpointManager::arenas_registered() const {
  const SaveCore& core = *core_;
  absl::MutexLock l(&core.mu);
  return core.arenas.size();
}

CudaInfo CheckpointManager::cuda_info() const {
  const SaveCore& core = *core_;
  CudaInfo info;
  info.available = core.stager != nullptr;
  info.unavailable_reason = core.cuda_unavailable;
  if (core.stager) {
    info.pinned_bytes = core.stager->pool_bytes();
    info.pinned_in_use = core.stager->pool_in_use();
    info.devices = core.stager->devices();
  }
  return info;
}

void CheckpointManager::TickForTest(absl::Time now) { save::Tick(*core_, now); }

MemoryTier* CheckpointManager::memory_tier() { return &core_->tier; }

Shares* CheckpointManager::shares() { return core_->shares.get(); }

CoordinatorLink* CheckpointManager::coordinator() {
  return core_->coordinator.get();
}

}  // namespace ckptd::daemon
