// Copyright 2026 The ckptd Authors.
//
// The record of one checkpoint attempt: what queries show of it, its tasks'
// accounting, the transitions that end it (failure or cancel, commit), the
// cleanup of a failed attempt's files, and its deadlines (attempt.h).
#include "daemon/save/attempt.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "common/absl_fmt.h"
#include "common/names.h"
#include "daemon/save/checkpoint_manager.h"
#include "daemon/save/cluster_link.h"
#include "daemon/save/external_commit.h"
#include "daemon/save/intake.h"
#include "daemon/save/tasks.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon::save {

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

namespace attempt {

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
// Tasks
// ---------------------------------------------------------------------------

void SubmitLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                  Task t) {
  if (!core.pool->Submit(std::move(t))) {
    // Only after Shutdown joined the pool (a late callback): the task is
    // dropped and the checkpoint was failed by Shutdown.
    spdlog::warn("checkpoint {}: task dropped, the daemon has stopped", c->dir);
    return;
  }
  ++c->busy_tasks;
}

void TaskEndLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                   Deferred& d) {
  --c->busy_tasks;
  MaybeCleanupLocked(core, c, d);
}

void TaskEnd(SaveCore& core, const std::shared_ptr<Checkpoint>& c) {
  Deferred d;
  absl::MutexLock l(&core.mu);
  TaskEndLocked(core, c, d);
}

// ---------------------------------------------------------------------------
// Final states
// ---------------------------------------------------------------------------

void FinishLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                  Deferred& d) {
  const CheckpointInfo info = InfoOf(*c);
  if (core.options.observer != nullptr)
    core.options.observer->CheckpointFinished(info);
  for (auto& w : c->waiters) {
    d.Add(
        [done = std::move(w.done), info]() mutable { std::move(done)(info); });
  }
  c->waiters.clear();
}

void FailLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                absl::Status error, State state, Deferred& d) {
  if (IsFinal(c->state)) return;
  if (!c->io_dir.empty() && absl::StrContains(error.message(), c->io_dir)) {
    // Errors name the directory as the client knows it, not its fd path.
    error = absl::Status(
        error.code(),
        absl::StrReplaceAll(error.message(), {{c->io_dir, c->dir}}));
  }
  c->state = state;
  c->aborted = true;
  c->error = error;
  c->awaiting_metadata_since = absl::InfinitePast();
  c->finished = core.clock->Now();
  if (state == State::kCancelled) {
    spdlog::warn("checkpoint {} cancelled: {}", c->dir,
                 EscapeForLog(std::string(error.message())));
  } else {
    spdlog::error("checkpoint {} failed: {}", c->dir,
                  EscapeForLog(error.ToString()));
  }
  intake::GiveBackLocked(core, c, error, d);
  FinishLocked(core, c, d);
  intake::AdmitLocked(core, d);
  MaybeCleanupLocked(core, c, d);  // now, if no task runs for it
  // Abort everywhere (the coordinator ignores it if it aborted first).
  if (c->node) cluster_link::AbortAtCoordinatorLocked(core, c, error, d);
}

void CommittedLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     Deferred& d) {
  c->state = State::kCommitted;
  c->finished = core.clock->Now();
  c->cleaned = true;
  // The directory is the committed checkpoint's, no attempt's any more: a
  // retry or retention may take it at once (the task itself ends after
  // step 7 and retention).
  tasks::ReleaseDirLocked(core, c, d);
  FinishLocked(core, c, d);
}

// ---------------------------------------------------------------------------
// Cleanup
// ---------------------------------------------------------------------------

void MaybeCleanupLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                        Deferred& d) {
  if (c->busy_tasks > 0 || !IsFinal(c->state) || c->cleanup_running) return;
  if (c->state == State::kCommitted || c->cleaned || !c->owns_dir) {
    c->cleaned = true;
    tasks::ReleaseDirLocked(core, c, d);
    Compact(*c);
    return;
  }
  c->cleaned = true;
  c->cleanup_running = true;
  // On the pool (joined by Shutdown, after which Submit runs the task on the
  // calling thread), not under the lock.
  d.Add([&core, c] {
    core.pool->SubmitOrRun([&core, c] {
      RunCleanup(core, c);
      Deferred d;
      absl::MutexLock l(&core.mu);
      c->cleanup_running = false;
      tasks::ReleaseDirLocked(core, c, d);
      Compact(*c);
    });
  });
}

void RunCleanup(SaveCore& core, const std::shared_ptr<Checkpoint>& c) {
  std::vector<std::string> files;
  for (RankState& rs : c->ranks) {
    if (rs.writer == nullptr) continue;
    if (std::optional<std::string> path = rs.writer->Abandon())
      files.push_back(*std::move(path));
  }
  RemoveAttemptFiles(core.committer, c->dir, c->dirh.get(), c->created_dir,
                     files);
  core.journal.Remove(c->journal_path);
}

// ---------------------------------------------------------------------------
// Deadlines
// ---------------------------------------------------------------------------

void TickLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                absl::Time now, Deferred& d) {
  const DaemonOptions& o = core.options;
  if (c->ranks_staged < c->num_local &&
      now - c->last_progress > o.stage_timeout) {
    std::vector<int> missing, unseen;
    for (int r : c->local) {
      if (!c->ranks[r].staged) missing.push_back(r);
      if (!c->ranks[r].indexed) unseen.push_back(r);
    }
    // A single-node checkpoint whose ranks never came: most likely they
    // run on other nodes, each talking to its own daemon.
    const std::string hint =
        c->multi || unseen.empty()
            ? std::string()
            : fmt::format(
                  "; ranks [{}] never reached this daemon: if they run on "
                  "other nodes (another daemon), the save needs a cluster "
                  "(ckptd.discover_cluster(), CheckpointManager(cluster="
                  "\"auto\"); ckptd.StorageWriter finds it by itself)",
                  FormatRanks(unseen));
    FailLocked(core, c,
               absl::DeadlineExceededError(
                   fmt::format("ranks [{}] of {} made no progress for {} "
                               "(stage_timeout){}",
                               FormatRanks(missing), c->world_size,
                               absl::FormatDuration(o.stage_timeout), hint)),
               State::kFailed, d);
    return;
  }
  if (c->node && c->node->plan_sent) {
    cluster_link::HeartbeatLocked(core, c, now, d);
    if (IsFinal(c->state)) return;
  }
  external_commit::TickMetadataLocked(core, c, now, d);
  if (IsFinal(c->state)) return;
  for (int r = 0; r < c->world_size; ++r) {
    const RankState& rs = c->ranks[r];
    if (!rs.staged && rs.awaiting_next_since != absl::InfinitePast() &&
        now - rs.awaiting_next_since > o.batch_gap_timeout) {
      FailLocked(
          core, c,
          absl::AbortedError(fmt::format(
              "the client of rank {} sent no next batch for {} after its "
              "previous one "
              "(batch_gap_timeout): it went away before its data was staged",
              r, absl::FormatDuration(o.batch_gap_timeout))),
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

}  // namespace attempt
}  // namespace ckptd::daemon::save
