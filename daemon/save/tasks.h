// Copyright 2026 The ckptd Authors.
//
// The tasks that run the stages of an attempt on the I/O pool, in the
// order one save meets them: the plan task (once the attempt owns its
// directory), one writer task per local rank, the commit task and, after
// it, retention. The durability steps (docs/durability.md) fall to them:
//
//   0   journal entry            PrepareAttempt (commit/journal.h)
//   1   directory, stale marker  PrepareAttempt (commit/committer.h)
//   2   data files fsynced       RunRankWriter (write/rank_writer.h)
//   3–6 .metadata published      RunCommit (commit/committer.h), or the
//                                coordinator (multi-node)
//   7   history, journal entry   SettleCommit (RunCommit, cluster_link's
//       removed, retention       NodeCommitted, recovered commits at start)
//
// A failure or cancel before 5 removes the attempt's data files,
// `.metadata.tmp` and journal entry (attempt::RunCleanup); a failure after
// 5 is un-published by the committer.
//
// Directory ownership: one attempt at a time owns a checkpoint directory
// (SaveCore::dirs), from its plan task until it is committed, or failed and
// its files removed. A retry waits for it here, off the pool: no task ever
// waits on a pool thread for another task.
#ifndef CKPTD_DAEMON_SAVE_TASKS_H_
#define CKPTD_DAEMON_SAVE_TASKS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/tasks.h"
#include "daemon/commit/committer.h"
#include "daemon/commit/retention.h"
#include "daemon/save/attempt.h"
#include "daemon/save/save_core.h"
#include "daemon/types/save_types.h"
#include "format/plan/commit_protocol.h"

namespace ckptd::daemon::save::tasks {

// --- The directory and the plan ------------------------------------------

// Submits c's plan task once c owns its directory: at once if no other
// attempt at the same directory owns it, else when that attempt gives it
// back (ReleaseDirLocked).
void StartPlanLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// Submits the plan task of `c`, which owns its directory: RunPlan, or
// cluster_link::RunNodePlan for a multi-node checkpoint.
void SubmitPlanLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// `c` gives its directory back, if it owns it.
void ReleaseDirLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                      Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// `owner` (a Checkpoint::seq, or kRetentionOwner) gives `dir` back: the
// oldest queued attempt still unfinished takes it and its plan is
// submitted.
void ReleaseDirOwnerLocked(SaveCore& core, const std::string& dir,
                           uint64_t owner, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

// Step 0 (journal) and step 1 (directory) of an attempt, off the lock;
// RecordAttemptLocked keeps what was made (also after a failure: the
// cleanup removes it).
struct PreparedAttempt {
  absl::Status status;
  std::string journal_path;  // empty: step 0 failed
  PreparedDirectory dir;     // dir.dir null: step 1 failed
};
PreparedAttempt PrepareAttempt(SaveCore& core, const CommitRecord& record,
                               bool check_marker, bool overwrite,
                               const format::StepCheck& before_remove);
void RecordAttemptLocked(SaveCore& core, Checkpoint& c, PreparedAttempt& a)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// The single-node plan task: the plan (plan/node_planner.h), steps 0–1,
// then ApplyPlanLocked.
void RunPlan(SaveCore& core, std::shared_ptr<Checkpoint> c);
// The plan is in (single-node planner or the coordinator's answer): the
// writers are made and scheduled.
void ApplyPlanLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     WritePlan plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

// --- Step 2: the writers -------------------------------------------------

// Submits rank r's writer task if it has work (adopted extents, or its
// last batch staged) and none runs.
void ScheduleRankLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                        int r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// Rank r's writer task: passes over the extents queued for it until it has
// none and, its last batch staged, its file is written and fsynced.
void RunRankWriter(SaveCore& core, std::shared_ptr<Checkpoint> c, int r);
// The rank writer's pass over `work` is done: bytes released, replies,
// the rank finished; the last local rank written starts the commit.
void RankPassDoneLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                        int r, const std::vector<StagedExtent>& work,
                        uint64_t file_growth, const absl::Status& s,
                        Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

// --- Steps 3–7 (single-node), retention ----------------------------------

// The single-node commit task: steps 3–6 (commit/committer.h; DCP's
// `.metadata` for external_metadata), the memory tier, then step 7.
void RunCommit(SaveCore& core, std::shared_ptr<Checkpoint> c);
// After step 6: the memory tier holds what c's writers captured.
std::shared_ptr<const TierCheckpoint> HoldInMemory(
    SaveCore& core, const std::shared_ptr<Checkpoint>& c);
// Step 7 of a commit: the history recorded durably, then the attempt's
// journal entry removed (`journal_path`; empty: none), then what
// retention lets go deleted (journaled). rule.keep_last_n <= 0:
// options.keep_last_n; retain=false only records (a multi-node
// checkpoint's retention is its coordinator's).
void SettleCommit(SaveCore& core, const CommitRecord& commit,
                  const std::string& journal_path, RetentionRule rule = {},
                  bool retain = true);

}  // namespace ckptd::daemon::save::tasks

#endif  // CKPTD_DAEMON_SAVE_TASKS_H_
