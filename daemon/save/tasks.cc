// Copyright 2026 The ckptd Authors.
//
// The orchestrator, part 3: the tasks that run the stages on the I/O pool
// (plan/node_planner, write/rank_writer, commit/committer, cleanup),
// directory ownership between attempts, failure, and retention after a
// commit. The durability steps are numbered in docs/durability.md:
//
//   0   journal entry            PrepareAttempt (commit/journal.h)
//   1   directory, stale marker  PrepareAttempt (commit/committer.h)
//   2   data files fsynced       RunRankWriter (write/rank_writer.h)
//   3–6 .metadata published      RunCommit (commit/committer.h), or the
//                                coordinator (multi-node)
//   7   history, journal entry    SettleCommit (RunCommit, NodeCommitted,
//       removed, retention       recovered commits at start-up)
//
// A failure or cancel before 5 removes the attempt's data files,
// `.metadata.tmp` and journal entry (RunCleanup); a failure after 5 is
// un-published by the committer.
#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/commit/external_metadata.h"
#include "daemon/plan/node_planner.h"
#include "daemon/save/checkpoint_manager_impl.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

// ---------------------------------------------------------------------------
// Directory ownership and task scheduling
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::StartPlanLocked(
    const std::shared_ptr<Checkpoint>& c) {
  DirClaim& claim = dirs_[c->dir];
  if (claim.owner != 0 && claim.owner != c->seq) {
    spdlog::info(
        "checkpoint {}: waiting for an earlier attempt at the directory to "
        "finish",
        c->dir);
    claim.queued.push_back(c);
    ++c->busy_tasks;  // the queued plan: released by ReleaseDirOwnerLocked
    return;
  }
  claim.owner = c->seq;
  c->owns_dir = true;
  SubmitPlanLocked(c);
}

void CheckpointManager::Impl::SubmitPlanLocked(
    const std::shared_ptr<Checkpoint>& c) {
  if (c->multi) {
    SubmitLocked(c, [this, c]() mutable { RunNodePlan(std::move(c)); });
  } else {
    SubmitLocked(c, [this, c]() mutable { RunPlan(std::move(c)); });
  }
}

void CheckpointManager::Impl::ReleaseDirLocked(
    const std::shared_ptr<Checkpoint>& c, Deferred& d) {
  if (!c->owns_dir) return;
  c->owns_dir = false;
  ReleaseDirOwnerLocked(c->dir, c->seq, d);
}

void CheckpointManager::Impl::ReleaseDirOwnerLocked(const std::string& dir,
                                                    uint64_t owner,
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

void CheckpointManager::Impl::SubmitLocked(const std::shared_ptr<Checkpoint>& c,
                                           Task t) {
  if (!pool_->Submit(std::move(t))) {
    // Only after Shutdown joined the pool (a late callback): the task is
    // dropped and the checkpoint was failed by Shutdown.
    spdlog::warn("checkpoint {}: task dropped, the daemon has stopped", c->dir);
    return;
  }
  ++c->busy_tasks;
}

void CheckpointManager::Impl::ScheduleRankLocked(
    const std::shared_ptr<Checkpoint>& c, int r) {
  RankState& rs = c->ranks[r];
  if (!c->dir_ready || IsFinal(c->state) || rs.busy || rs.done) return;
  if (rs.queue.empty() && !rs.staged) return;
  rs.busy = true;
  SubmitLocked(c, [this, c, r]() mutable { RunRankWriter(std::move(c), r); });
}

// ---------------------------------------------------------------------------
// Steps 0–1 and the plan
// ---------------------------------------------------------------------------

CheckpointManager::Impl::PreparedAttempt
CheckpointManager::Impl::PrepareAttempt(
    const CommitRecord& record, bool check_marker, bool overwrite,
    const format::StepCheck& before_remove) {
  PreparedAttempt out;
  // 0. The journal entry, durably, before anything in the directory.
  absl::StatusOr<std::string> entry = journal_.Add(record);
  out.status = entry.status();
  if (!out.status.ok()) return out;
  out.journal_path = *std::move(entry);
  // 1. The directory, opened beneath its root (no symlinks), each new
  // component durable in its parent; no stale commit marker.
  absl::StatusOr<PreparedDirectory> dir = PrepareDirectory(
      committer_, record.dir, check_marker, overwrite, before_remove);
  out.status = dir.status();
  if (dir.ok()) out.dir = *std::move(dir);
  return out;
}

void CheckpointManager::Impl::RecordAttemptLocked(Checkpoint& c,
                                                  PreparedAttempt& a) {
  c.journal_path = std::move(a.journal_path);
  c.created_dir = a.dir.created;
  if (a.dir.dir != nullptr) {
    c.io_dir = a.dir.dir->io_path();
    c.dirh = std::move(a.dir.dir);
  }
}

void CheckpointManager::Impl::RunPlan(std::shared_ptr<Checkpoint> c) {
  // The ranks' indexes are complete and no longer change.
  std::vector<const RankIndex*> indexes;
  CommitRecord record;
  {
    absl::MutexLock l(&mu_);
    if (IsFinal(c->state)) {
      // Cancelled or failed before its plan ran: touch nothing on disk.
      Deferred d;
      TaskEndLocked(c, d);
      return;
    }
    indexes = c->AllIndexes();
    record = {c->dir,       c->job, c->uid,
              std::nullopt, false,  absl::ToUnixMillis(c->created)};
  }
  absl::StatusOr<WritePlan> plan = PlanSingleNode(
      indexes, {c->dedup_lowest,
                options_.max_items * static_cast<uint64_t>(c->world_size)});
  PreparedAttempt attempt;
  if (plan.ok()) {
    attempt = PrepareAttempt(record, /*check_marker=*/true, c->overwrite, [c] {
      return c->aborted.load() ? absl::CancelledError(
                                     "cancelled before it replaced " + c->dir)
                               : absl::OkStatus();
    });
  }
  const absl::Status s = plan.ok() ? attempt.status : plan.status();
  // What the tier held of an earlier checkpoint in this directory is being
  // replaced.
  if (s.ok()) tier_.Drop(c->dir);
  Deferred d;
  absl::MutexLock l(&mu_);
  RecordAttemptLocked(*c, attempt);
  if (!IsFinal(c->state)) {
    if (s.ok()) {
      ApplyPlanLocked(c, *std::move(plan));
    } else {
      FailLocked(c, s, State::kFailed, d);
    }
  }
  TaskEndLocked(c, d);
}

void CheckpointManager::Impl::ApplyPlanLocked(
    const std::shared_ptr<Checkpoint>& c, WritePlan plan) {
  c->plan = std::move(plan);
  c->infos.resize(c->plan.plan.items.size());
  RankWriterOptions wo{env_, options_.fsync, &limiter_};
  wo.zstd_level = c->zstd_level;
  if (c->tier_capture == nullptr) c->tier_capture = tier_.Begin(c->dir, c->job);
  wo.capture = c->tier_capture.get();
  for (int r : c->local) {
    c->ranks[r].writer = std::make_unique<RankWriter>(
        wo, r, &c->ranks[r].index, &c->plan.ranks[r], c->io_dir);
  }
  c->dir_ready = true;
  if (c->state == State::kPending) {
    c->state =
        c->ranks_staged == c->num_local ? State::kWriting : State::kStaging;
  }
  if (c->multi) {
    spdlog::info(
        "checkpoint {}: node plan{}: {} items into {} files on this node",
        c->dir, c->plan.cached ? " (coordinator's plan cache)" : "",
        c->plan.plan.items.size(), c->plan.plan.files.size());
  } else {
    spdlog::info("checkpoint {}: planned {} items into {} files", c->dir,
                 c->plan.plan.items.size(), c->plan.plan.files.size());
  }
  for (int r : c->local) ScheduleRankLocked(c, r);
}

// ---------------------------------------------------------------------------
// Step 2: the writers
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::RunRankWriter(std::shared_ptr<Checkpoint> c,
                                            int r) {
  RankState& rs = c->ranks[r];
  RankWriter& w = *rs.writer;  // this task holds the rank's `busy` flag
  while (true) {
    std::vector<StagedExtent> work;
    bool staged = false;
    {
      Deferred d;
      absl::MutexLock l(&mu_);
      if (IsFinal(c->state) ||
          (rs.queue.empty() && (!rs.staged || w.finished()))) {
        rs.busy = false;
        TaskEndLocked(c, d);
        return;
      }
      work.assign(std::make_move_iterator(rs.queue.begin()),
                  std::make_move_iterator(rs.queue.end()));
      rs.queue.clear();
      staged = rs.staged;
    }
    absl::Status s;
    const uint64_t size_before = w.file_size();
    for (const StagedExtent& e : work) {
      s = w.Consume(e, c->aborted, c->written_live);
      if (!s.ok()) break;
      if (e.arena != nullptr) e.arena->map->DropPages(e.arena_offset, e.length);
    }
    if (s.ok() && staged) s = w.Advance();
    const uint64_t growth = w.file_size() - size_before;
    Deferred d;
    absl::MutexLock l(&mu_);
    RankPassDoneLocked(c, r, work, growth, s, d);
  }
}

void CheckpointManager::Impl::RankPassDoneLocked(
    const std::shared_ptr<Checkpoint>& c, int r,
    const std::vector<StagedExtent>& work, uint64_t file_growth,
    const absl::Status& s, Deferred& d) {
  RankState& rs = c->ranks[r];
  uint64_t consumed = 0;
  uint64_t arena_consumed = 0;
  for (const StagedExtent& e : work) {
    consumed += e.length;
    if (e.arena != nullptr) arena_consumed += e.length;
    ReleaseExtentLocked(e, d);
  }
  staging_.Release(arena_consumed);
  rs.consumed += consumed;
  c->written_bytes += file_growth;
  if (rs.consume_done && rs.consumed >= rs.consume_target) {
    save_calls_.erase(rs.consume_token);
    rs.call_token = 0;
    rs.awaiting_next_since = clock_->Now();
    SaveReply reply{c->dir, State::kStaging, rs.adopted};
    d.Add([done = std::move(rs.consume_done), reply]() mutable {
      std::move(done)(reply);
    });
    rs.consume_done = nullptr;
  }
  AdmitLocked(d);
  if (!s.ok()) {
    if (!IsFinal(c->state)) FailLocked(c, s, State::kFailed, d);
    return;
  }
  if (!rs.writer->finished() || rs.done) return;
  rs.done = true;
  for (auto& [p, info] : rs.writer->TakeResult().items)
    c->infos[p] = std::move(info);
  if (++c->ranks_done == c->num_local && !IsFinal(c->state)) {
    c->state = State::kCommitting;
    if (c->multi) {
      SubmitLocked(c, [this, c]() mutable { RunNodePrepare(std::move(c)); });
    } else if (c->external_metadata) {
      DataDurableLocked(c, d);
    } else {
      SubmitLocked(c, [this, c]() mutable { RunCommit(std::move(c)); });
    }
  }
}

// ---------------------------------------------------------------------------
// Steps 3–7 (single-node), retention
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::RunCommit(std::shared_ptr<Checkpoint> c) {
  format::Metadata skeleton;
  std::vector<format::StorageInfo> infos;
  std::vector<const RankIndex*> indexes;
  std::string external;  // external_metadata: DCP's .metadata
  {
    absl::MutexLock l(&mu_);
    skeleton = std::move(c->plan.plan.metadata);
    infos = c->infos;
    indexes = c->AllIndexes();
    external = std::move(c->external_bytes);
  }
  const format::StepCheck before_publish = [this, c]() -> absl::Status {
    absl::MutexLock l(&mu_);
    return IsFinal(c->state) ? absl::CancelledError("ended before its commit")
                             : absl::OkStatus();
  };
  const CommitResult result =
      c->external_metadata
          ? CommitExternal(committer_, c->io_dir, c->plan, indexes, infos,
                           external, before_publish)
          : Commit(committer_, c->dir, c->io_dir, c->plan, std::move(skeleton),
                   indexes, infos, before_publish);
  if (result.status.ok()) HoldInMemory(c);
  bool committed = false;
  CommitRecord record;
  RetentionRule rule;
  {
    // Waiters are answered when this block ends, before retention: deleting
    // old checkpoints can take seconds (file systems mounted with `discard`)
    // and is not part of the commit.
    Deferred d;
    absl::MutexLock l(&mu_);
    if (!result.status.ok()) {
      if (result.marker_may_remain) {
        // Keep the data and the journal entry: the next start settles it.
        c->cleaned = true;
        spdlog::error(
            "checkpoint {}: .metadata could not be un-published; its files "
            "stay for "
            "recovery to settle",
            c->dir);
      }
      if (!IsFinal(c->state)) FailLocked(c, result.status, State::kFailed, d);
    } else if (!IsFinal(c->state)) {
      spdlog::info(
          "checkpoint {} committed: {} bytes in {} files, {} after the first "
          "request",
          c->dir, c->written_bytes, c->plan.plan.files.size(),
          absl::FormatDuration(clock_->Now() - c->created));
      CommittedLocked(c, d);
      committed = true;
      record = {c->dir,       c->job, c->uid,
                std::nullopt, false,  absl::ToUnixMillis(c->created)};
      rule = {c->keep_last_n, c->keep_every};
    }
    // A committed checkpoint's task ends after step 7 and retention (so
    // Shutdown waits for them).
    if (!committed) TaskEndLocked(c, d);
  }
  if (committed) {
    SettleCommit(record, c->journal_path, rule);  // 7.
    TaskEnd(c);
  } else if (result.status.ok()) {
    tier_.Drop(c->dir);
  }
}

void CheckpointManager::Impl::HoldInMemory(
    const std::shared_ptr<Checkpoint>& c) {
  std::shared_ptr<TierCapture> capture;
  {
    absl::MutexLock l(&mu_);
    capture = std::move(c->tier_capture);
  }
  // While this attempt still owns the directory: the identities recorded
  // are those of the files it wrote.
  if (capture != nullptr) tier_.Commit(std::move(capture), c->io_dir);
}

void CheckpointManager::Impl::CommittedLocked(
    const std::shared_ptr<Checkpoint>& c, Deferred& d) {
  c->state = State::kCommitted;
  c->finished = clock_->Now();
  c->cleaned = true;
  // The directory is the committed checkpoint's, no attempt's any more: a
  // retry or retention may take it at once (the task itself ends after
  // step 7 and retention).
  ReleaseDirLocked(c, d);
  FinishLocked(c, d);
}

void CheckpointManager::Impl::SettleCommit(const CommitRecord& commit,
                                           const std::string& journal_path,
                                           RetentionRule rule, bool retain) {
  const std::string& job = commit.job;
  const int64_t uid = commit.uid;
  int keep_last_n = rule.keep_last_n;
  if (keep_last_n <= 0) keep_last_n = options_.keep_last_n;
  if (!retain) keep_last_n = 0;
  absl::MutexLock io(&history_io_mu_);
  History::Recorded rec;
  {
    absl::MutexLock l(&mu_);
    rec = history_.Record(job, uid, commit.dir, commit.started_ms, keep_last_n,
                          rule.keep_every);
  }
  // 7. The history first, durably, then the journal entry: a crash in
  // between leaves the entry, and recovery records the commit again; the
  // other way round a commit could go missing from the history (and never
  // be pruned).
  if (absl::Status s = WriteHistory(
          env_, JoinPath(options_.state_dir, "history"), rec.record);
      !s.ok()) {
    spdlog::error(
        "could not record the history of job '{}': {} (the journal entry "
        "stays until the job's history is written again)",
        EscapeForLog(job), s);
    unrecorded_journals_[{job, uid}].push_back(journal_path);
  } else {
    journal_.Remove(journal_path);
    auto earlier = unrecorded_journals_.find({job, uid});
    if (earlier != unrecorded_journals_.end()) {
      for (const std::string& p : earlier->second) journal_.Remove(p);
      spdlog::info(
          "history of job '{}' written: the journal entries of {} earlier "
          "commit(s) whose history write had failed are retired",
          EscapeForLog(job), earlier->second.size());
      unrecorded_journals_.erase(earlier);
    }
  }
  for (const std::string& old : rec.doomed) {
    {
      // Only while no attempt at the directory is going: retention owns it
      // while deleting.
      absl::MutexLock l(&mu_);
      if (dirs_.contains(old)) continue;  // being written again: not ours
      auto it = ckpts_.find(old);
      if (it != ckpts_.end() && !IsFinal(it->second->state)) continue;
      dirs_[old].owner = kRetentionOwner;
    }
    // Beneath the roots only (CheckpointDir); journaled.
    const absl::Status s = DeleteCommitted(
        env_, journal_, options_.checkpoint_roots, old, job, uid);
    if (s.ok()) {
      tier_.Drop(old);
      spdlog::info("retention (keep_last_n={}{}): deleted {}", keep_last_n,
                   rule.keep_every > 0
                       ? fmt::format(", keep_every={}", rule.keep_every)
                       : std::string(),
                   old);
    } else {
      spdlog::error("retention: could not delete {}: {}", EscapeForLog(old), s);
    }
    Deferred d;
    absl::MutexLock l(&mu_);
    if (s.ok()) {
      if (auto it = ckpts_.find(old);
          it != ckpts_.end() && IsFinal(it->second->state)) {
        ckpts_.erase(it);
      }
    }
    ReleaseDirOwnerLocked(old, kRetentionOwner, d);
  }
}

// ---------------------------------------------------------------------------
// Failure, task ends, cleanup
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::FinishLocked(const std::shared_ptr<Checkpoint>& c,
                                           Deferred& d) {
  const CheckpointInfo info = InfoOf(*c);
  if (options_.observer != nullptr) options_.observer->CheckpointFinished(info);
  for (auto& w : c->waiters) {
    d.Add(
        [done = std::move(w.done), info]() mutable { std::move(done)(info); });
  }
  c->waiters.clear();
}

void CheckpointManager::Impl::FailLocked(const std::shared_ptr<Checkpoint>& c,
                                         absl::Status error, State state,
                                         Deferred& d) {
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
  c->finished = clock_->Now();
  if (state == State::kCancelled) {
    spdlog::warn("checkpoint {} cancelled: {}", c->dir,
                 EscapeForLog(std::string(error.message())));
  } else {
    spdlog::error("checkpoint {} failed: {}", c->dir,
                  EscapeForLog(error.ToString()));
  }
  // Batches waiting for budget (not charged) and at the GPU stager
  // (charged; its late answer finds them gone).
  for (auto* batches : {&waiting_, &device_staging_}) {
    for (auto it = batches->begin(); it != batches->end();) {
      auto next = std::next(it);
      if (it->second->ckpt == c) {
        if (batches == &waiting_) {
          staging_.Remove(it->first);
        } else {
          staging_.Release(it->second->arena_bytes);
        }
        DropBatchLocked(*it->second, error, d);
        batches->erase(it);
      }
      it = next;
    }
  }
  for (RankState& rs : c->ranks) {
    uint64_t held = 0;
    for (const StagedExtent& e : rs.queue) {
      if (e.arena != nullptr) held += e.length;
      ReleaseExtentLocked(e, d);
    }
    rs.queue.clear();
    staging_.Release(held);
    if (rs.consume_done) {
      save_calls_.erase(rs.consume_token);
      d.Add([done = std::move(rs.consume_done), error]() mutable {
        std::move(done)(error);
      });
      rs.consume_done = nullptr;
    }
    rs.call_token = 0;
  }
  FinishLocked(c, d);
  AdmitLocked(d);
  MaybeCleanupLocked(c, d);  // now, if no task runs for it
  // Abort everywhere (the coordinator ignores it if it aborted first).
  if (c->node) AbortAtCoordinatorLocked(c, error, d);
}

// Every task submitted for `c` calls this exactly once, at its end.
void CheckpointManager::Impl::TaskEndLocked(
    const std::shared_ptr<Checkpoint>& c, Deferred& d) {
  --c->busy_tasks;
  MaybeCleanupLocked(c, d);
}

void CheckpointManager::Impl::TaskEnd(const std::shared_ptr<Checkpoint>& c) {
  Deferred d;
  absl::MutexLock l(&mu_);
  TaskEndLocked(c, d);
}

// The last one out of a final checkpoint settles its directory: a committed
// one (or one whose files are deliberately kept) gives it back at once; a
// failed or cancelled one that owned it removes its files first (after the
// lock is released, on the pool), then gives it back. An attempt that never
// owned its directory touched nothing on disk.
void CheckpointManager::Impl::MaybeCleanupLocked(
    const std::shared_ptr<Checkpoint>& c, Deferred& d) {
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
  // No task runs for c any more (busy_tasks == 0, cleanup_running).
  std::vector<std::string> files;
  for (RankState& rs : c->ranks) {
    if (rs.writer == nullptr) continue;
    if (std::optional<std::string> path = rs.writer->Abandon())
      files.push_back(*std::move(path));
  }
  RemoveAttemptFiles(committer_, c->dir, c->dirh.get(), c->created_dir, files);
  journal_.Remove(c->journal_path);
}

}  // namespace ckptd::daemon
