// Copyright 2026 The ckptd Authors.
//
// The plan, write and commit tasks of an attempt on the I/O pool, in the
// order one save runs them, with directory ownership between attempts and
// retention after a commit (tasks.h numbers the durability steps each
// task takes).
#include "daemon/save/tasks.h"

#include <iterator>
#include <optional>
#include <utility>

#include "common/absl_fmt.h"
#include "common/names.h"
#include "daemon/commit/external_metadata.h"
#include "daemon/plan/node_planner.h"
#include "daemon/save/cluster_link.h"
#include "daemon/save/external_commit.h"
#include "daemon/save/intake.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon::save::tasks {

// ---------------------------------------------------------------------------
// Directory ownership
// ---------------------------------------------------------------------------

void StartPlanLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c) {
  DirClaim& claim = core.dirs[c->dir];
  if (claim.owner != 0 && claim.owner != c->seq) {
    spdlog::info(
        "checkpoint {}: waiting for {} to finish", c->dir,
        claim.owner == kRecoveryOwner
            ? "start-up recovery's decision on this node's files of the "
              "attempt before the restart (its coordinator may still commit "
              "it; commit_timeout + peer_timeout)"
            : "an earlier attempt at the directory");
    claim.queued.push_back(c);
    ++c->busy_tasks;  // the queued plan: released by ReleaseDirOwnerLocked
    return;
  }
  claim.owner = c->seq;
  c->owns_dir = true;
  SubmitPlanLocked(core, c);
}

void SubmitPlanLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c) {
  if (c->multi) {
    attempt::SubmitLocked(core, c, [&core, c]() mutable {
      cluster_link::RunNodePlan(core, std::move(c));
    });
  } else {
    attempt::SubmitLocked(
        core, c, [&core, c]() mutable { RunPlan(core, std::move(c)); });
  }
}

void ReleaseDirLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                      Deferred& d) {
  if (!c->owns_dir) return;
  c->owns_dir = false;
  ReleaseDirOwnerLocked(core, c->dir, c->seq, d);
}

void ReleaseDirOwnerLocked(SaveCore& core, const std::string& dir,
                           uint64_t owner, Deferred& d) {
  auto it = core.dirs.find(dir);
  if (it == core.dirs.end() || it->second.owner != owner) return;
  DirClaim& claim = it->second;
  claim.owner = 0;
  while (!claim.queued.empty()) {
    std::shared_ptr<Checkpoint> next = std::move(claim.queued.front());
    claim.queued.pop_front();
    --next->busy_tasks;  // its queued plan
    if (IsFinal(next->state)) {
      // Ended while queued: it never touched the directory.
      attempt::MaybeCleanupLocked(core, next, d);
      continue;
    }
    claim.owner = next->seq;
    next->owns_dir = true;
    SubmitPlanLocked(core, next);
    return;
  }
  core.dirs.erase(it);
}

// ---------------------------------------------------------------------------
// Steps 0–1 and the plan
// ---------------------------------------------------------------------------

PreparedAttempt PrepareAttempt(SaveCore& core, const CommitRecord& record,
                               bool check_marker, bool overwrite,
                               const format::StepCheck& before_remove) {
  PreparedAttempt out;
  // 0. The journal entry, durably, before anything in the directory.
  absl::StatusOr<std::string> entry = core.journal.Add(record);
  out.status = entry.status();
  if (!out.status.ok()) return out;
  out.journal_path = *std::move(entry);
  // 1. The directory, opened beneath its root (no symlinks), each new
  // component durable in its parent; no stale commit marker.
  absl::StatusOr<PreparedDirectory> dir = PrepareDirectory(
      core.committer, record.dir, check_marker, overwrite, before_remove);
  out.status = dir.status();
  if (dir.ok()) out.dir = *std::move(dir);
  return out;
}

void RecordAttemptLocked(SaveCore& core, Checkpoint& c, PreparedAttempt& a) {
  c.journal_path = std::move(a.journal_path);
  c.created_dir = a.dir.created;
  if (a.dir.dir != nullptr) {
    c.io_dir = a.dir.dir->io_path();
    c.dirh = std::move(a.dir.dir);
  }
}

void RunPlan(SaveCore& core, std::shared_ptr<Checkpoint> c) {
  // The ranks' indexes are complete and no longer change.
  std::vector<const RankIndex*> indexes;
  CommitRecord record;
  {
    absl::MutexLock l(&core.mu);
    if (IsFinal(c->state)) {
      // Cancelled or failed before its plan ran: touch nothing on disk.
      Deferred d;
      attempt::TaskEndLocked(core, c, d);
      return;
    }
    indexes = c->AllIndexes();
    record = {c->dir,       c->job, c->uid,
              std::nullopt, false,  absl::ToUnixMillis(c->created)};
  }
  absl::StatusOr<WritePlan> plan = PlanSingleNode(
      indexes, {c->dedup_lowest,
                core.options.max_items * static_cast<uint64_t>(c->world_size)});
  PreparedAttempt attempt;
  if (plan.ok()) {
    attempt =
        PrepareAttempt(core, record, /*check_marker=*/true, c->overwrite, [c] {
          return c->aborted.load()
                     ? absl::CancelledError("cancelled before it replaced " +
                                            c->dir)
                     : absl::OkStatus();
        });
  }
  const absl::Status s = plan.ok() ? attempt.status : plan.status();
  // What the tier held of an earlier checkpoint in this directory is being
  // replaced.
  if (s.ok()) core.tier.Drop(c->dir);
  Deferred d;
  absl::MutexLock l(&core.mu);
  RecordAttemptLocked(core, *c, attempt);
  if (!IsFinal(c->state)) {
    if (s.ok()) {
      ApplyPlanLocked(core, c, *std::move(plan));
    } else {
      attempt::FailLocked(core, c, s, State::kFailed, d);
    }
  }
  attempt::TaskEndLocked(core, c, d);
}

void ApplyPlanLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     WritePlan plan) {
  c->plan = std::move(plan);
  c->infos.resize(c->plan.plan.items.size());
  RankWriterOptions wo{core.env, core.options.fsync, &core.limiter};
  wo.zstd_level = c->zstd_level;
  if (c->tier_capture == nullptr)
    c->tier_capture = core.tier.Begin(c->dir, c->job);
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
  for (int r : c->local) ScheduleRankLocked(core, c, r);
}

// ---------------------------------------------------------------------------
// Step 2: the writers
// ---------------------------------------------------------------------------

void ScheduleRankLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                        int r) {
  RankState& rs = c->ranks[r];
  if (!c->dir_ready || IsFinal(c->state) || rs.busy || rs.done) return;
  if (rs.queue.empty() && !rs.staged) return;
  rs.busy = true;
  attempt::SubmitLocked(core, c, [&core, c, r]() mutable {
    RunRankWriter(core, std::move(c), r);
  });
}

void RunRankWriter(SaveCore& core, std::shared_ptr<Checkpoint> c, int r) {
  RankState& rs = c->ranks[r];
  RankWriter& w = *rs.writer;  // this task holds the rank's `busy` flag
  while (true) {
    std::vector<StagedExtent> work;
    bool staged = false;
    {
      Deferred d;
      absl::MutexLock l(&core.mu);
      if (IsFinal(c->state) ||
          (rs.queue.empty() && (!rs.staged || w.finished()))) {
        rs.busy = false;
        attempt::TaskEndLocked(core, c, d);
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
    absl::MutexLock l(&core.mu);
    RankPassDoneLocked(core, c, r, work, growth, s, d);
  }
}

void RankPassDoneLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                        int r, const std::vector<StagedExtent>& work,
                        uint64_t file_growth, const absl::Status& s,
                        Deferred& d) {
  RankState& rs = c->ranks[r];
  uint64_t consumed = 0;
  uint64_t arena_consumed = 0;
  for (const StagedExtent& e : work) {
    consumed += e.length;
    if (e.arena != nullptr) arena_consumed += e.length;
    intake::ReleaseExtentLocked(core, e, d);
  }
  core.staging.Release(arena_consumed);
  rs.consumed += consumed;
  c->written_bytes += file_growth;
  if (rs.consume_done && rs.consumed >= rs.consume_target) {
    core.save_calls.erase(rs.consume_token);
    rs.call_token = 0;
    rs.awaiting_next_since = core.clock->Now();
    SaveReply reply{c->dir, State::kStaging, rs.adopted};
    d.Add([done = std::move(rs.consume_done), reply]() mutable {
      std::move(done)(reply);
    });
    rs.consume_done = nullptr;
  }
  intake::AdmitLocked(core, d);
  if (!s.ok()) {
    if (!IsFinal(c->state)) attempt::FailLocked(core, c, s, State::kFailed, d);
    return;
  }
  if (!rs.writer->finished() || rs.done) return;
  rs.done = true;
  for (auto& [p, info] : rs.writer->TakeResult().items)
    c->infos[p] = std::move(info);
  if (++c->ranks_done == c->num_local && !IsFinal(c->state)) {
    c->state = State::kCommitting;
    if (c->multi) {
      attempt::SubmitLocked(core, c, [&core, c]() mutable {
        cluster_link::RunNodePrepare(core, std::move(c));
      });
    } else if (c->external_metadata) {
      external_commit::DataDurableLocked(core, c, d);
    } else {
      attempt::SubmitLocked(
          core, c, [&core, c]() mutable { RunCommit(core, std::move(c)); });
    }
  }
}

// ---------------------------------------------------------------------------
// Steps 3–7 (single-node), retention
// ---------------------------------------------------------------------------

void RunCommit(SaveCore& core, std::shared_ptr<Checkpoint> c) {
  format::Metadata skeleton;
  std::vector<format::StorageInfo> infos;
  std::vector<const RankIndex*> indexes;
  std::string external;  // external_metadata: DCP's .metadata
  {
    absl::MutexLock l(&core.mu);
    skeleton = std::move(c->plan.plan.metadata);
    infos = c->infos;
    indexes = c->AllIndexes();
    external = std::move(c->external_bytes);
  }
  const format::StepCheck before_publish = [&core, c]() -> absl::Status {
    absl::MutexLock l(&core.mu);
    return IsFinal(c->state) ? absl::CancelledError("ended before its commit")
                             : absl::OkStatus();
  };
  const CommitResult result =
      c->external_metadata
          ? CommitExternal(core.committer, c->io_dir, c->plan, indexes, infos,
                           external, before_publish)
          : Commit(core.committer, c->dir, c->io_dir, c->plan,
                   std::move(skeleton), indexes, infos, before_publish);
  if (result.status.ok()) HoldInMemory(core, c);
  bool committed = false;
  CommitRecord record;
  RetentionRule rule;
  {
    // Waiters are answered when this block ends, before retention: deleting
    // old checkpoints can take seconds (file systems mounted with `discard`)
    // and is not part of the commit.
    Deferred d;
    absl::MutexLock l(&core.mu);
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
      if (!IsFinal(c->state))
        attempt::FailLocked(core, c, result.status, State::kFailed, d);
    } else if (!IsFinal(c->state)) {
      spdlog::info(
          "checkpoint {} committed: {} bytes in {} files, {} after the first "
          "request",
          c->dir, c->written_bytes, c->plan.plan.files.size(),
          absl::FormatDuration(core.clock->Now() - c->created));
      attempt::CommittedLocked(core, c, d);
      committed = true;
      record = {c->dir,       c->job, c->uid,
                std::nullopt, false,  absl::ToUnixMillis(c->created)};
      rule = {c->keep_last_n, c->keep_every};
    }
    // A committed checkpoint's task ends after step 7 and retention (so
    // Shutdown waits for them).
    if (!committed) attempt::TaskEndLocked(core, c, d);
  }
  if (committed) {
    SettleCommit(core, record, c->journal_path, rule);  // 7.
    attempt::TaskEnd(core, c);
  } else if (result.status.ok()) {
    core.tier.Drop(c->dir);
  }
}

std::shared_ptr<const TierCheckpoint> HoldInMemory(
    SaveCore& core, const std::shared_ptr<Checkpoint>& c) {
  std::shared_ptr<TierCapture> capture;
  {
    absl::MutexLock l(&core.mu);
    capture = std::move(c->tier_capture);
  }
  // While this attempt still owns the directory: the identities recorded
  // are those of the files it wrote.
  if (capture == nullptr) return nullptr;
  return core.tier.Commit(std::move(capture), c->io_dir);
}

void SettleCommit(SaveCore& core, const CommitRecord& commit,
                  const std::string& journal_path, RetentionRule rule,
                  bool retain) {
  const std::string& job = commit.job;
  const int64_t uid = commit.uid;
  int keep_last_n = rule.keep_last_n;
  if (keep_last_n <= 0) keep_last_n = core.options.keep_last_n;
  if (!retain) keep_last_n = 0;
  absl::MutexLock io(&core.history_io_mu);
  History::Recorded rec;
  {
    absl::MutexLock l(&core.mu);
    rec = core.history.Record(job, uid, commit.dir, commit.started_ms,
                              keep_last_n, rule.keep_every);
  }
  // 7. The history first, durably, then the journal entry: a crash in
  // between leaves the entry, and recovery records the commit again; the
  // other way round a commit could go missing from the history (and never
  // be pruned).
  if (absl::Status s = WriteHistory(
          core.env, JoinPath(core.options.state_dir, "history"), rec.record);
      !s.ok()) {
    spdlog::error(
        "could not record the history of job '{}': {} (the journal entry "
        "stays until the job's history is written again)",
        EscapeForLog(job), s);
    core.unrecorded_journals[{job, uid}].push_back(journal_path);
  } else {
    core.journal.Remove(journal_path);
    auto earlier = core.unrecorded_journals.find({job, uid});
    if (earlier != core.unrecorded_journals.end()) {
      for (const std::string& p : earlier->second) core.journal.Remove(p);
      spdlog::info(
          "history of job '{}' written: the journal entries of {} earlier "
          "commit(s) whose history write had failed are retired",
          EscapeForLog(job), earlier->second.size());
      core.unrecorded_journals.erase(earlier);
    }
  }
  for (const std::string& old : rec.doomed) {
    {
      // Only while no attempt at the directory is going: retention owns it
      // while deleting.
      absl::MutexLock l(&core.mu);
      if (core.dirs.contains(old)) continue;  // being written again: not ours
      auto it = core.ckpts.find(old);
      if (it != core.ckpts.end() && !IsFinal(it->second->state)) continue;
      core.dirs[old].owner = kRetentionOwner;
    }
    // Beneath the roots only (CheckpointDir); journaled.
    const absl::Status s = DeleteCommitted(
        core.env, core.journal, core.options.checkpoint_roots, old, job, uid);
    if (s.ok()) {
      core.tier.Drop(old);
      spdlog::info("retention (keep_last_n={}{}): deleted {}", keep_last_n,
                   rule.keep_every > 0
                       ? fmt::format(", keep_every={}", rule.keep_every)
                       : std::string(),
                   old);
    } else {
      spdlog::error("retention: could not delete {}: {}", EscapeForLog(old), s);
    }
    Deferred d;
    absl::MutexLock l(&core.mu);
    if (s.ok()) {
      if (auto it = core.ckpts.find(old);
          it != core.ckpts.end() && IsFinal(it->second->state)) {
        core.ckpts.erase(it);
      }
    }
    ReleaseDirOwnerLocked(core, old, kRetentionOwner, d);
  }
}

}  // namespace ckptd::daemon::save::tasks
