// Copyright 2026 The ckptd Authors.
//
// The orchestrator, part 2: the Save path through staging — the validator
// (staging/save_validator.h), the arena registry, the staging pool's budget
// and backpressure, the GPU stager — up to the batches adopted into each
// rank's queue for its writer. checkpoint_manager_impl.h describes the whole.
#include <algorithm>
#include <utility>

#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/commit/paths.h"
#include "daemon/save/checkpoint_manager_impl.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

// ---------------------------------------------------------------------------
// Arenas (staging/arena_registry.h)
// ---------------------------------------------------------------------------

absl::StatusOr<uint64_t> CheckpointManager::Impl::RegisterArena(
    std::string_view name, uint64_t size, std::string_view owner,
    int64_t client_pid) {
  {
    absl::MutexLock l(&mu_);
    if (arenas_.size() >= options_.max_arenas) {
      return absl::ResourceExhaustedError(fmt::format(
          "{} arenas are registered already (max_arenas); release unused ones",
          arenas_.size()));
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Arena> arena,
                   ArenaRegistry::MapNamed(shm_dir_fd_, options_.shm_dir, name,
                                           size, owner, client_pid));
  absl::MutexLock l(&mu_);
  // The quota of the file's owner (known only once mapped; the mapping is
  // dropped on refusal).
  RETURN_IF_ERROR(arenas_.CheckQuota(arena->uid, arena->map->size()));
  const uint64_t id = arenas_.Insert(arena);
  spdlog::info("arena {} registered: '{}' {} bytes of uid={}, owner '{}'", id,
               EscapeForLog(name), size, arena->uid, EscapeForLog(owner));
  return id;
}

absl::StatusOr<uint64_t> CheckpointManager::Impl::RegisterArenaFd(
    int fd, uint64_t size, std::string_view owner,
    const shm::PeerCredentials& peer) {
  shm::OwnedFd owned(fd);
  {
    // Refused before mapping anything when the quota is spent already.
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(arenas_.CheckQuota(peer.uid, size));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Arena> arena,
                   ArenaRegistry::MapFd(owned.Release(), size, owner, peer));
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(arenas_.CheckQuota(peer.uid, size));  // a racing registration
  const uint64_t id = arenas_.Insert(arena);
  spdlog::info(
      "arena {} registered: 'memfd' {} bytes by uid={} pid={} gid={} "
      "(SO_PEERCRED), owner '{}'",
      id, size, peer.uid, peer.pid, peer.gid, EscapeForLog(owner));
  return id;
}

absl::Status CheckpointManager::Impl::ReleaseArena(uint64_t id) {
  Deferred d;
  absl::MutexLock l(&mu_);
  return arenas_.Release(id, d);
}

std::shared_ptr<const Arena> CheckpointManager::Impl::FindArena(uint64_t id) {
  absl::MutexLock l(&mu_);
  std::shared_ptr<Arena> arena = arenas_.Find(id);
  if (arena != nullptr) arena->last_used = clock_->Now();
  return arena;
}

uint64_t CheckpointManager::Impl::WaitArenaIdle(uint64_t id,
                                                absl::Time deadline,
                                                DoneCallback done) {
  Deferred d;
  absl::MutexLock l(&mu_);
  const uint64_t token = next_token_++;
  arenas_.WaitIdle(id, token, deadline, std::move(done), d);
  return token;
}

void CheckpointManager::Impl::ReleaseExtentLocked(const StagedExtent& e,
                                                  Deferred& d) {
  if (e.arena != nullptr) arenas_.Unhold(*e.arena, e.length, d);
  // else: pinned pool or CUDA, `hold` frees it
}

// ---------------------------------------------------------------------------
// Save: validation and staging
// ---------------------------------------------------------------------------

uint64_t CheckpointManager::Impl::Save(SaveBatch batch, SaveCallback done) {
  std::sort(batch.cluster.local_ranks.begin(), batch.cluster.local_ranks.end());
  // Resolved before the lock: realpath is I/O (slow on NFS).
  const absl::Status header = ValidateSaveHeader(batch, validator_);
  absl::StatusOr<std::string> dir = header.ok()
                                        ? Resolve(batch.checkpoint_id)
                                        : absl::StatusOr<std::string>(header);
  Deferred d;
  absl::MutexLock l(&mu_);
  const uint64_t token = next_token_++;
  absl::Status s = stopping_
                       ? absl::UnavailableError("the daemon is shutting down")
                       : dir.status();
  if (s.ok()) s = SaveLocked(batch, *dir, token, done, d);
  if (!s.ok()) {
    spdlog::warn("Save {} rank {} sequence {} rejected: {}",
                 EscapeForLog(batch.checkpoint_id), batch.rank, batch.sequence,
                 EscapeForLog(s.ToString()));
    if (options_.observer != nullptr) options_.observer->SaveRejected(s);
    d.Add([done = std::move(done), s]() mutable { std::move(done)(s); });
  }
  return token;
}

absl::StatusOr<std::shared_ptr<Checkpoint>>
CheckpointManager::Impl::NewAttemptLocked(SaveBatch& batch,
                                          const std::string& dir) {
  if (batch.sequence != 0) {
    return absl::FailedPreconditionError(
        fmt::format("checkpoint {} is not in progress; rank {} sent batch {} "
                    "without sequence 0",
                    dir, batch.rank, batch.sequence));
  }
  int active = 0;
  for (const auto& [k, v] : ckpts_) active += IsFinal(v->state) ? 0 : 1;
  if (active >= options_.max_active_checkpoints) {
    return absl::ResourceExhaustedError(fmt::format(
        "{} checkpoints are in progress already (max_active_checkpoints)",
        active));
  }
  ForgetOldestFinishedLocked();
  auto c = std::make_shared<Checkpoint>();
  c->seq = next_seq_++;
  c->dir = dir;
  c->job = batch.job.empty() ? DirName(dir) : batch.job;
  c->world_size = batch.world_size;
  c->overwrite = batch.overwrite;
  c->dedup_lowest = batch.dedup_save_to_lowest_rank;
  c->keep_last_n = batch.keep_last_n;
  c->keep_every = batch.keep_every;
  c->zstd_level = batch.zstd_level;
  c->external_metadata = batch.external_metadata;
  c->metadata_timeout = batch.metadata_timeout;
  c->created = c->last_progress = clock_->Now();
  c->ranks.resize(batch.world_size);
  RETURN_IF_ERROR(JoinClusterLocked(*c, batch));
  if (c->multi && (c->external_metadata || c->zstd_level != 0)) {
    return absl::InvalidArgumentError(
        "external_metadata (DCP's StorageWriter) and compression are for "
        "single-node checkpoints; this one spans several nodes");
  }
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
  return c;
}

absl::StatusOr<std::shared_ptr<Checkpoint>>
CheckpointManager::Impl::AttemptLocked(SaveBatch& batch,
                                       const std::string& dir) {
  if (auto it = ckpts_.find(dir);
      it != ckpts_.end() && !IsFinal(it->second->state)) {
    return it->second;
  }
  return NewAttemptLocked(batch, dir);
}

absl::Status CheckpointManager::Impl::CheckBatchLocked(const Checkpoint& c,
                                                       const SaveBatch& batch) {
  if (batch.world_size != c.world_size) {
    return absl::InvalidArgumentError(
        fmt::format("rank {} says world_size {} but checkpoint {} has {}",
                    batch.rank, batch.world_size, c.dir, c.world_size));
  }
  if (batch.sequence == 0 &&
      (batch.cluster.num_nodes > 1 ? batch.cluster : ClusterSpec{}) !=
          (c.multi ? c.cluster : ClusterSpec{})) {
    return absl::InvalidArgumentError(
        fmt::format("rank {}'s cluster (coordinator, local_ranks, num_nodes) "
                    "differs from that of the "
                    "node's other ranks",
                    batch.rank));
  }
  if (!std::binary_search(c.local.begin(), c.local.end(), batch.rank)) {
    return absl::InvalidArgumentError(fmt::format(
        "rank {} is not one of this node's ranks [{}] of checkpoint {}",
        batch.rank, fmt::join(c.local, ", "), c.dir));
  }
  const RankState& rs = c.ranks[batch.rank];
  if (rs.call_token != 0) {
    return absl::FailedPreconditionError(fmt::format(
        "rank {} sent a Save while its previous one is in flight", batch.rank));
  }
  if (batch.sequence != rs.next_sequence || rs.last_received) {
    return absl::InvalidArgumentError(
        fmt::format("rank {} sent batch {} of checkpoint {}; expected {}",
                    batch.rank, batch.sequence, c.dir,
                    rs.last_received ? "none (its last batch was sent)"
                                     : fmt::format("{}", rs.next_sequence)));
  }
  if (batch.sequence == 0 &&
      (batch.overwrite != c.overwrite ||
       batch.dedup_save_to_lowest_rank != c.dedup_lowest ||
       batch.keep_last_n != c.keep_last_n || batch.keep_every != c.keep_every ||
       batch.zstd_level != c.zstd_level ||
       batch.external_metadata != c.external_metadata ||
       batch.metadata_timeout != c.metadata_timeout)) {
    return absl::InvalidArgumentError(fmt::format(
        "rank {}'s save options differ from those of the other ranks",
        batch.rank));
  }
  if (batch.sequence != 0 && !batch.items.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("rank {} batch {} carries items; only sequence 0 may",
                    batch.rank, batch.sequence));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PendingBatch>>
CheckpointManager::Impl::StageBatchLocked(Checkpoint& c, SaveBatch& batch) {
  RankState& rs = c.ranks[batch.rank];
  const bool device =
      !batch.cuda_buffers.empty() ||
      std::any_of(batch.extents.begin(), batch.extents.end(),
                  [](const ExtentRef& e) { return e.cuda_buffer != 0; });
  if (device && stager_ == nullptr) {
    return absl::FailedPreconditionError(
        fmt::format("rank {}: this daemon does not stage CUDA tensors ({}); "
                    "copy them to host memory "
                    "(clients do when GetInfo.cuda_ipc is false)",
                    batch.rank, cuda_unavailable_));
  }
  if (device) {
    RETURN_IF_ERROR(ValidateCudaBuffers(
        batch.rank, batch.cuda_buffers,
        [this](std::string_view dev) { return stager_->DeviceIndex(dev); },
        validator_));
  }
  auto pb = std::make_unique<PendingBatch>();
  std::shared_ptr<Arena> arena;
  if (std::any_of(batch.extents.begin(), batch.extents.end(),
                  [](const ExtentRef& e) { return e.cuda_buffer == 0; })) {
    arena = arenas_.Find(batch.arena_id);
    if (arena == nullptr) {
      return absl::InvalidArgumentError(fmt::format(
          "rank {}: arena {} is not registered", batch.rank, batch.arena_id));
    }
  }
  ASSIGN_OR_RETURN(
      ValidatedBatch vb,
      ValidateExtents(batch.rank, rs.index, rs.cursor, batch.extents,
                      arena ? arena->map.get() : nullptr, batch.cuda_buffers,
                      validator_));
  if (vb.device_bytes > 0 &&
      stager_->PoolBytesFor(vb.device_bytes) > stager_->pool_bytes()) {
    return absl::ResourceExhaustedError(
        fmt::format("rank {}: batch of {} device bytes does not fit the pinned "
                    "staging pool of {} "
                    "bytes (pinned_staging_bytes); send smaller batches",
                    batch.rank, vb.device_bytes, stager_->pool_bytes()));
  }
  if (batch.last) RETURN_IF_ERROR(CheckComplete(batch.rank, rs.index, vb.next));
  RETURN_IF_ERROR(staging_.CheckRoom());
  if (arena != nullptr) {
    const int64_t uid = arena->uid;
    if (c.uid == kUnknownUid) {
      c.uid = uid;
    } else if (c.uid != uid && c.uid != kMixedUid) {
      spdlog::warn(
          "checkpoint {}: ranks of uid {} and uid {} save into it; retention "
          "will "
          "not prune for it",
          c.dir, c.uid, uid);
      c.uid = kMixedUid;
    }
    for (StagedExtent& e : vb.extents) {
      if (e.cuda_buffer == 0) e.arena = arena;
    }
    arenas_.Hold(*arena, vb.arena_bytes);
  }
  rs.cursor = vb.next;
  pb->extents = std::move(vb.extents);
  pb->bytes = vb.bytes;
  pb->arena_bytes = vb.arena_bytes;
  pb->device_pending = vb.device_bytes > 0;
  pb->cuda_buffers = std::move(batch.cuda_buffers);
  return pb;
}

absl::Status CheckpointManager::Impl::SaveLocked(SaveBatch& batch,
                                                 const std::string& dir,
                                                 uint64_t token,
                                                 SaveCallback& done,
                                                 Deferred& d) {
  ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> c, AttemptLocked(batch, dir));
  // From here on a bad request fails the checkpoint too: its other ranks
  // cannot complete it.
  auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FailLocked(c, s, State::kFailed, d);
    return s;
  };
  if (absl::Status s = CheckBatchLocked(*c, batch); !s.ok()) return fail(s);
  RankState& rs = c->ranks[batch.rank];
  if (batch.sequence == 0) {
    absl::StatusOr<RankIndex> index = ValidateIndex(batch, validator_);
    if (!index.ok()) return fail(index.status());
    rs.index = *std::move(index);
    rs.indexed = true;
    c->total_bytes += rs.index.total;
    ++c->ranks_indexed;
  }
  absl::StatusOr<std::unique_ptr<PendingBatch>> pb =
      StageBatchLocked(*c, batch);
  if (!pb.ok()) return fail(pb.status());
  rs.received += (*pb)->bytes;
  rs.awaiting_next_since = absl::InfinitePast();
  rs.last_received = batch.last;
  ++rs.next_sequence;
  rs.call_token = token;
  c->last_progress = clock_->Now();
  save_calls_[token] = {c, batch.rank};
  (*pb)->token = token;
  (*pb)->ckpt = c;
  (*pb)->rank = batch.rank;
  (*pb)->last = batch.last;
  (*pb)->done = std::move(done);
  staging_.Enqueue(token, (*pb)->arena_bytes);
  waiting_[token] = *std::move(pb);
  AdmitLocked(d);
  if (c->ranks_indexed == c->num_local && !c->planned && c->busy_tasks == 0 &&
      !IsFinal(c->state)) {
    c->planned = true;  // the plan task owns it now (once it owns the dir)
    StartPlanLocked(c);
  }
  return absl::OkStatus();
}

// Adopts waiting batches in arrival order while they fit the budget.
void CheckpointManager::Impl::AdmitLocked(Deferred& d) {
  for (uint64_t token : staging_.Admit()) {
    auto it = waiting_.find(token);
    std::unique_ptr<PendingBatch> pb = std::move(it->second);
    waiting_.erase(it);
    if (pb->device_pending) {
      StageDeviceLocked(std::move(pb), d);
    } else {
      AdoptLocked(*pb, d);
    }
  }
}

void CheckpointManager::Impl::AdoptLocked(PendingBatch& pb, Deferred& d) {
  Checkpoint& c = *pb.ckpt;
  RankState& rs = c.ranks[pb.rank];
  rs.adopted += pb.bytes;
  c.staged_bytes += pb.bytes;
  c.last_progress = clock_->Now();
  for (StagedExtent& e : pb.extents) rs.queue.push_back(std::move(e));
  SaveReply reply{c.dir, State::kStaging, rs.adopted};
  auto answer_now = [&](SaveCallback done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    rs.call_token = 0;
    save_calls_.erase(pb.token);
    d.Add(
        [done = std::move(done), reply]() mutable { std::move(done)(reply); });
  };
  if (pb.last) {
    rs.staged = true;
    ++c.ranks_staged;
    reply.state = State::kStaged;
    answer_now(std::move(pb.done));
    if (c.ranks_staged == c.num_local) {
      c.staged = clock_->Now();
      if (c.state == State::kStaging || c.state == State::kPending)
        c.state = State::kWriting;
      spdlog::info("checkpoint {}: all {} {}ranks staged ({} bytes) in {}",
                   c.dir, c.num_local, c.multi ? "local " : "", c.staged_bytes,
                   absl::FormatDuration(c.staged - c.created));
    }
  } else if (pb.arena_bytes == 0) {
    // No arena space to give back (the bytes are in the pinned pool): the
    // next batch may come at once, its copies overlapping this one's writes.
    rs.awaiting_next_since = clock_->Now();
    answer_now(std::move(pb.done));
  } else {
    rs.consume_target = rs.adopted;
    rs.consume_token = pb.token;
    rs.consume_done = std::move(pb.done);
    if (rs.consumed >= rs.consume_target) {
      rs.awaiting_next_since = clock_->Now();
      answer_now(std::move(rs.consume_done));
      rs.consume_done = nullptr;
    }
  }
  ScheduleRankLocked(pb.ckpt, pb.rank);
}

// ---------------------------------------------------------------------------
// Staging from CUDA (staging/gpu_stager.h)
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::StageDeviceLocked(
    std::unique_ptr<PendingBatch> pb, Deferred& d) {
  std::shared_ptr<Checkpoint> c = pb->ckpt;
  StageJob job;
  job.what = fmt::format("checkpoint {} rank {}", c->dir, pb->rank);
  job.buffers = pb->cuda_buffers;
  for (const StagedExtent& e : pb->extents) {
    if (e.cuda_buffer != 0)
      job.copies.push_back({e.cuda_buffer - 1, e.arena_offset, e.length});
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
    stager_->Stage(std::move(job),
                   [this, c, token](absl::StatusOr<StageResult> r) mutable {
                     DeviceStaged(c, token, std::move(r));
                   });
  });
}

void CheckpointManager::Impl::DeviceStaged(const std::shared_ptr<Checkpoint>& c,
                                           uint64_t token,
                                           absl::StatusOr<StageResult> result) {
  Deferred d;
  absl::MutexLock l(&mu_);
  // Gone: the checkpoint ended meanwhile and FailLocked answered the call.
  auto it = device_staging_.find(token);
  if (it == device_staging_.end()) return;
  std::unique_ptr<PendingBatch> pb = std::move(it->second);
  device_staging_.erase(it);
  if (!result.ok()) {
    staging_.Release(pb->arena_bytes);
    DropBatchLocked(*pb, result.status(), d);
    FailLocked(c, result.status(), State::kFailed, d);
    return;
  }
  // The device extents, replaced by the pinned pieces now holding them.
  std::vector<StagedExtent> staged;
  staged.reserve(pb->extents.size());
  size_t k = 0;
  for (StagedExtent& e : pb->extents) {
    if (e.cuda_buffer == 0) {
      staged.push_back(std::move(e));
      continue;
    }
    uint64_t off = e.item_offset;
    for (StagedPiece& piece : (*result)[k++]) {
      staged.push_back({nullptr, piece.data, 0, piece.length, e.item, off,
                        std::move(piece.hold), 0});
      off += piece.length;
    }
  }
  pb->extents = std::move(staged);
  pb->device_pending = false;
  AdoptLocked(*pb, d);
}

void CheckpointManager::Impl::DropBatchLocked(PendingBatch& pb,
                                              const absl::Status& error,
                                              Deferred& d) {
  for (const StagedExtent& e : pb.extents) ReleaseExtentLocked(e, d);
  pb.extents.clear();
  save_calls_.erase(pb.token);
  RankState& rs = pb.ckpt->ranks[pb.rank];
  if (rs.call_token == pb.token) rs.call_token = 0;
  d.Add(
      [done = std::move(pb.done), error]() mutable { std::move(done)(error); });
}

}  // namespace ckptd::daemon
