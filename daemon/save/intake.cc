// Copyright 2026 The ckptd Authors.
//
// Intake: Save calls validated and adopted into an attempt (intake.h draws
// the path): the attempt found or made, the batch checked against it, its
// extents validated (staging/save_validator.h) and held in their arena,
// staging budget and backpressure (staging/staging_pool.h), the GPU stager
// for device extents, and the adopted extents queued for the rank's writer.
#include "daemon/save/intake.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "common/absl_fmt.h"
#include "common/failpoint.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/save/checkpoint_manager.h"
#include "daemon/save/cluster_link.h"
#include "daemon/save/tasks.h"
#include "daemon/staging/save_validator.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon::save::intake {
namespace {

// Finished checkpoints the daemon remembers for queries (Status, List,
// Wait), besides forget_after; each costs a few hundred bytes once settled.
constexpr size_t kMaxFinishedKept = 4096;

}  // namespace

// ---------------------------------------------------------------------------
// The call and its attempt
// ---------------------------------------------------------------------------

uint64_t Save(SaveCore& core, SaveBatch batch, SaveCallback done) {
  std::sort(batch.cluster.local_ranks.begin(), batch.cluster.local_ranks.end());
  // Resolved before the lock: realpath is I/O (slow on NFS).
  const absl::Status header = ValidateSaveHeader(batch, core.validator);
  absl::StatusOr<std::string> dir = header.ok()
                                        ? Resolve(core, batch.checkpoint_id)
                                        : absl::StatusOr<std::string>(header);
  Deferred d;
  absl::MutexLock l(&core.mu);
  const uint64_t token = core.next_token++;
  absl::Status s = core.stopping
                       ? absl::UnavailableError("the daemon is shutting down")
                       : dir.status();
  if (s.ok()) s = SaveLocked(core, batch, *dir, token, done, d);
  if (!s.ok()) {
    spdlog::warn("Save {} rank {} sequence {} rejected: {}",
                 EscapeForLog(batch.checkpoint_id), batch.rank, batch.sequence,
                 EscapeForLog(s.ToString()));
    if (core.options.observer != nullptr)
      core.options.observer->SaveRejected(s);
    d.Add([done = std::move(done), s]() mutable { std::move(done)(s); });
  }
  return token;
}

absl::Status SaveLocked(SaveCore& core, SaveBatch& batch,
                        const std::string& dir, uint64_t token,
                        SaveCallback& done, Deferred& d) {
  ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> c,
                   AttemptLocked(core, batch, dir));
  // From here on a bad request fails the checkpoint too: its other ranks
  // cannot complete it.
  auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu) {
    attempt::FailLocked(core, c, s, State::kFailed, d);
    return s;
  };
  if (absl::Status s = CheckBatchLocked(core, *c, batch); !s.ok())
    return fail(s);
  RankState& rs = c->ranks[batch.rank];
  if (batch.sequence == 0) {
    absl::StatusOr<RankIndex> index = ValidateIndex(batch, core.validator);
    if (!index.ok()) return fail(index.status());
    rs.index = *std::move(index);
    rs.indexed = true;
    c->total_bytes += rs.index.total;
    ++c->ranks_indexed;
  }
  absl::StatusOr<std::unique_ptr<PendingBatch>> pb =
      StageBatchLocked(core, *c, batch);
  if (!pb.ok()) return fail(pb.status());
  rs.received += (*pb)->bytes;
  rs.awaiting_next_since = absl::InfinitePast();
  rs.last_received = batch.last;
  ++rs.next_sequence;
  rs.call_token = token;
  c->last_progress = core.clock->Now();
  core.save_calls[token] = {c, batch.rank};
  (*pb)->token = token;
  (*pb)->ckpt = c;
  (*pb)->rank = batch.rank;
  (*pb)->last = batch.last;
  (*pb)->done = std::move(done);
  core.staging.Enqueue(token, (*pb)->arena_bytes);
  core.waiting[token] = *std::move(pb);
  AdmitLocked(core, d);
  if (c->ranks_indexed == c->num_local && !c->planned && c->busy_tasks == 0 &&
      !IsFinal(c->state)) {
    c->planned = true;  // the plan task owns it now (once it owns the dir)
    tasks::StartPlanLocked(core, c);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Checkpoint>> AttemptLocked(
    SaveCore& core, SaveBatch& batch, const std::string& dir) {
  if (auto it = core.ckpts.find(dir);
      it != core.ckpts.end() && !IsFinal(it->second->state)) {
    return it->second;
  }
  return NewAttemptLocked(core, batch, dir);
}

absl::StatusOr<std::shared_ptr<Checkpoint>> NewAttemptLocked(
    SaveCore& core, SaveBatch& batch, const std::string& dir) {
  if (batch.sequence != 0) {
    return absl::FailedPreconditionError(
        fmt::format("checkpoint {} is not in progress; rank {} sent batch {} "
                    "without sequence 0",
                    dir, batch.rank, batch.sequence));
  }
  int active = 0;
  for (const auto& [k, v] : core.ckpts) active += IsFinal(v->state) ? 0 : 1;
  if (active >= core.options.max_active_checkpoints) {
    return absl::ResourceExhaustedError(fmt::format(
        "{} checkpoints are in progress already (max_active_checkpoints)",
        active));
  }
  ForgetOldestFinishedLocked(core);
  auto c = std::make_shared<Checkpoint>();
  c->seq = core.next_seq++;
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
  c->created = c->last_progress = core.clock->Now();
  c->ranks.resize(batch.world_size);
  RETURN_IF_ERROR(cluster_link::JoinClusterLocked(core, *c, batch));
  core.ckpts[dir] = c;
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

void ForgetOldestFinishedLocked(SaveCore& core) {
  size_t settled = 0;
  for (const auto& [dir, c] : core.ckpts)
    settled += c->compacted && c->busy_tasks == 0;
  while (settled >= kMaxFinishedKept) {
    auto oldest = core.ckpts.end();
    for (auto it = core.ckpts.begin(); it != core.ckpts.end(); ++it) {
      const Checkpoint& c = *it->second;
      if (c.compacted && c.busy_tasks == 0 &&
          (oldest == core.ckpts.end() || c.seq < oldest->second->seq)) {
        oldest = it;
      }
    }
    if (oldest == core.ckpts.end()) return;
    core.ckpts.erase(oldest);
    --settled;
  }
}

absl::Status CheckBatchLocked(const SaveCore& core, const Checkpoint& c,
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

absl::StatusOr<std::unique_ptr<PendingBatch>> StageBatchLocked(
    SaveCore& core, Checkpoint& c, SaveBatch& batch) {
  RankState& rs = c.ranks[batch.rank];
  const bool device =
      !batch.cuda_buffers.empty() ||
      std::any_of(batch.extents.begin(), batch.extents.end(),
                  [](const ExtentRef& e) { return e.cuda_buffer != 0; });
  if (device && core.stager == nullptr) {
    return absl::FailedPreconditionError(
        fmt::format("rank {}: this daemon does not stage CUDA tensors ({}); "
                    "copy them to host memory "
                    "(clients do when GetInfo.cuda_ipc is false)",
                    batch.rank, core.cuda_unavailable));
  }
  if (device) {
    RETURN_IF_ERROR(ValidateCudaBuffers(
        batch.rank, batch.cuda_buffers,
        [&core](std::string_view dev) { return core.stager->DeviceIndex(dev); },
        core.validator));
  }
  auto pb = std::make_unique<PendingBatch>();
  std::shared_ptr<Arena> arena;
  if (std::any_of(batch.extents.begin(), batch.extents.end(),
                  [](const ExtentRef& e) { return e.cuda_buffer == 0; })) {
    arena = core.arenas.Find(batch.arena_id);
    if (arena == nullptr) {
      return absl::InvalidArgumentError(fmt::format(
          "rank {}: arena {} is not registered", batch.rank, batch.arena_id));
    }
  }
  ASSIGN_OR_RETURN(
      ValidatedBatch vb,
      ValidateExtents(batch.rank, rs.index, rs.cursor, batch.extents,
                      arena ? arena->map.get() : nullptr, batch.cuda_buffers,
                      core.validator));
  if (vb.device_bytes > 0 &&
      core.stager->PoolBytesFor(vb.device_bytes) > core.stager->pool_bytes()) {
    return absl::ResourceExhaustedError(
        fmt::format("rank {}: batch of {} device bytes does not fit the pinned "
                    "staging pool of {} "
                    "bytes (pinned_staging_bytes); send smaller batches",
                    batch.rank, vb.device_bytes, core.stager->pool_bytes()));
  }
  if (batch.last) RETURN_IF_ERROR(CheckComplete(batch.rank, rs.index, vb.next));
  RETURN_IF_ERROR(core.staging.CheckRoom());
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
    core.arenas.Hold(*arena, vb.arena_bytes);
  }
  rs.cursor = vb.next;
  pb->extents = std::move(vb.extents);
  pb->bytes = vb.bytes;
  pb->arena_bytes = vb.arena_bytes;
  pb->device_pending = vb.device_bytes > 0;
  pb->cuda_buffers = std::move(batch.cuda_buffers);
  return pb;
}

// ---------------------------------------------------------------------------
// Budget and adoption
// ---------------------------------------------------------------------------

void AdmitLocked(SaveCore& core, Deferred& d) {
  for (uint64_t token : core.staging.Admit()) {
    auto it = core.waiting.find(token);
    std::unique_ptr<PendingBatch> pb = std::move(it->second);
    core.waiting.erase(it);
    if (pb->device_pending) {
      StageDeviceLocked(core, std::move(pb), d);
    } else {
      AdoptLocked(core, *pb, d);
    }
  }
}

void AdoptLocked(SaveCore& core, PendingBatch& pb, Deferred& d) {
  Checkpoint& c = *pb.ckpt;
  RankState& rs = c.ranks[pb.rank];
  rs.adopted += pb.bytes;
  c.staged_bytes += pb.bytes;
  c.last_progress = core.clock->Now();
  for (StagedExtent& e : pb.extents) rs.queue.push_back(std::move(e));
  SaveReply reply{c.dir, State::kStaging, rs.adopted};
  auto answer_now = [&](SaveCallback done)
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu) {
                          rs.call_token = 0;
                          core.save_calls.erase(pb.token);
                          d.Add([done = std::move(done), reply]() mutable {
                            std::move(done)(reply);
                          });
                        };
  if (pb.last) {
    rs.staged = true;
    ++c.ranks_staged;
    reply.state = State::kStaged;
    answer_now(std::move(pb.done));
    if (c.ranks_staged == c.num_local) {
      c.staged = core.clock->Now();
      if (c.state == State::kStaging || c.state == State::kPending)
        c.state = State::kWriting;
      spdlog::info("checkpoint {}: all {} {}ranks staged ({} bytes) in {}",
                   c.dir, c.num_local, c.multi ? "local " : "", c.staged_bytes,
                   absl::FormatDuration(c.staged - c.created));
    }
  } else if (pb.arena_bytes == 0) {
    // No arena space to give back (the bytes are in the pinned pool): the
    // next batch may come at once, its copies overlapping this one's writes.
    rs.awaiting_next_since = core.clock->Now();
    answer_now(std::move(pb.done));
  } else {
    rs.consume_target = rs.adopted;
    rs.consume_token = pb.token;
    rs.consume_done = std::move(pb.done);
    if (rs.consumed >= rs.consume_target) {
      rs.awaiting_next_since = core.clock->Now();
      answer_now(std::move(rs.consume_done));
      rs.consume_done = nullptr;
    }
  }
  tasks::ScheduleRankLocked(core, pb.ckpt, pb.rank);
  if (c.multi && failpoint::Armed())
    d.Add([id = c.dir] { CKPTD_FAILPOINT("node.staging", id); });
}

// ---------------------------------------------------------------------------
// Staging from CUDA (staging/gpu_stager.h)
// ---------------------------------------------------------------------------

void StageDeviceLocked(SaveCore& core, std::unique_ptr<PendingBatch> pb,
                       Deferred& d) {
  std::shared_ptr<Checkpoint> c = pb->ckpt;
  StageJob job;
  job.what = fmt::format("checkpoint {} rank {}", c->dir, pb->rank);
  job.buffers = pb->cuda_buffers;
  for (const StagedExtent& e : pb->extents) {
    if (e.cuda_buffer != 0)
      job.copies.push_back({e.cuda_buffer - 1, e.arena_offset, e.length});
  }
  job.cancelled = [&core, w = std::weak_ptr<Checkpoint>(c)] {
    std::shared_ptr<Checkpoint> c = w.lock();
    absl::MutexLock l(&core.mu);
    return c == nullptr || IsFinal(c->state) || core.stopping;
  };
  const uint64_t token = pb->token;
  // Not a busy task: the stager's late answer only looks up the token (the
  // plan waits for busy tasks, and must not wait for staging).
  core.device_staging[token] = std::move(pb);
  // The stager may answer at once (shutting down): not under core.mu.
  d.Add([&core, c, token, job = std::move(job)]() mutable {
    core.stager->Stage(
        std::move(job),
        [&core, c, token](absl::StatusOr<StageResult> r) mutable {
          DeviceStaged(core, c, token, std::move(r));
        });
  });
}

void DeviceStaged(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                  uint64_t token, absl::StatusOr<StageResult> result) {
  Deferred d;
  absl::MutexLock l(&core.mu);
  // Gone: the checkpoint ended meanwhile and FailLocked answered the call.
  auto it = core.device_staging.find(token);
  if (it == core.device_staging.end()) return;
  std::unique_ptr<PendingBatch> pb = std::move(it->second);
  core.device_staging.erase(it);
  if (!result.ok()) {
    core.staging.Release(pb->arena_bytes);
    DropBatchLocked(core, *pb, result.status(), d);
    attempt::FailLocked(core, c, result.status(), State::kFailed, d);
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
  AdoptLocked(core, *pb, d);
}

// ---------------------------------------------------------------------------
// Giving back
// ---------------------------------------------------------------------------

void DropBatchLocked(SaveCore& core, PendingBatch& pb,
                     const absl::Status& error, Deferred& d) {
  for (const StagedExtent& e : pb.extents) ReleaseExtentLocked(core, e, d);
  pb.extents.clear();
  core.save_calls.erase(pb.token);
  RankState& rs = pb.ckpt->ranks[pb.rank];
  if (rs.call_token == pb.token) rs.call_token = 0;
  d.Add(
      [done = std::move(pb.done), error]() mutable { std::move(done)(error); });
}

void ReleaseExtentLocked(SaveCore& core, const StagedExtent& e, Deferred& d) {
  if (e.arena != nullptr) core.arenas.Unhold(*e.arena, e.length, d);
  // else: pinned pool or CUDA, `hold` frees it
}

void GiveBackLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                    const absl::Status& error, Deferred& d) {
  // Batches waiting for budget (not charged) and at the GPU stager
  // (charged; its late answer finds them gone).
  for (auto* batches : {&core.waiting, &core.device_staging}) {
    for (auto it = batches->begin(); it != batches->end();) {
      auto next = std::next(it);
      if (it->second->ckpt == c) {
        if (batches == &core.waiting) {
          core.staging.Remove(it->first);
        } else {
          core.staging.Release(it->second->arena_bytes);
        }
        DropBatchLocked(core, *it->second, error, d);
        batches->erase(it);
      }
      it = next;
    }
  }
  for (RankState& rs : c->ranks) {
    uint64_t held = 0;
    for (const StagedExtent& e : rs.queue) {
      if (e.arena != nullptr) held += e.length;
      ReleaseExtentLocked(core, e, d);
    }
    rs.queue.clear();
    core.staging.Release(held);
    if (rs.consume_done) {
      core.save_calls.erase(rs.consume_token);
      d.Add([done = std::move(rs.consume_done), error]() mutable {
        std::move(done)(error);
      });
      rs.consume_done = nullptr;
    }
    rs.call_token = 0;
  }
}

}  // namespace ckptd::daemon::save::intake
