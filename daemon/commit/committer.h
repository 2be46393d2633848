// Copyright 2026 The ckptd Authors.
//
// The committer: the directory steps of docs/durability.md for one attempt
// of this daemon, around the writers' step 2.
//
//   PrepareDirectory   step 1: the checkpoint directory opened beneath its
//                      root (created durably if missing; CheckpointDir) and,
//                      for a single-node checkpoint, a stale `.metadata`
//                      refused or removed (format/plan/commit_protocol.h)
//   Commit             steps 3–6 of a single-node checkpoint: `.metadata`
//                      (the plan's skeleton + storage_data from the writers'
//                      results) published; on failure nothing stays
//                      published
//   RemoveAttemptFiles after a failure or cancel: the attempt's data files
//                      and `.metadata.tmp`, and the directory if it made it
//
// Multi-node checkpoints publish at their coordinator
// (cluster/coordinator.h) with the same protocol functions.
//
// Takes: WritePlan (plan/), RankWriteResult (write/); hands on: the commit
// (or the error) to the orchestrator. Pure functions over an Env;
// thread-compatible per attempt (the orchestrator's directory ownership
// guarantees one attempt per directory).
#ifndef CKPTD_DAEMON_COMMIT_COMMITTER_H_
#define CKPTD_DAEMON_COMMIT_COMMITTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/env.h"
#include "daemon/commit/checkpoint_dir.h"
#include "daemon/types/save_types.h"
#include "format/plan/commit_protocol.h"

namespace ckptd::daemon {

struct CommitterOptions {
  Env* env = nullptr;
  std::vector<std::string> checkpoint_roots;
  bool fsync = true;
};

struct PreparedDirectory {
  std::unique_ptr<CheckpointDir> dir;
  bool created = false;  // the attempt made the directory itself
};

// Step 1 for `dir` (resolved, beneath a root). `check_marker`: refuse or
// (with `overwrite`) remove a stale `.metadata` — a node of a multi-node
// checkpoint leaves that to its coordinator. `before_remove` runs before a
// stale marker is removed (a cancelled attempt must not remove it).
absl::StatusOr<PreparedDirectory> PrepareDirectory(
    const CommitterOptions& options, const std::string& dir, bool check_marker,
    bool overwrite, const format::StepCheck& before_remove);

struct CommitResult {
  absl::Status status;
  uint64_t metadata_bytes = 0;
  // The failure came after the rename and `.metadata` could not be removed
  // again: the directory may look committed, so the attempt's data files
  // must be kept (a torn checkpoint would be worse; recovery keeps it).
  bool marker_may_remain = false;
};

// Steps 3–6 of a single-node checkpoint in `io_dir`: `.metadata` is the
// plan's `skeleton` (state_dict_metadata, planner_data) completed with
// storage_data — plan.plan.items in order, each keyed by its rank's item
// (`indexes[rank]`) and located by `infos[p]` (the writers' results) — and
// storage_meta naming `dir`. `before_publish` runs after step 3 (a
// checkpoint cancelled meanwhile is not published: its error is returned).
CommitResult Commit(const CommitterOptions& options, const std::string& dir,
                    const std::string& io_dir, const WritePlan& plan,
                    format::Metadata skeleton,
                    absl::Span<const RankIndex* const> indexes,
                    std::vector<format::StorageInfo> infos,
                    const format::StepCheck& before_publish);

// After a failed or cancelled attempt: removes `data_files`, `.metadata.tmp`
// in `dir` (if prepared) and the directory itself if `created` and empty.
// Errors are logged, never returned: there is nobody left to tell.
void RemoveAttemptFiles(const CommitterOptions& options,
                        const std::string& checkpoint, CheckpointDir* dir,
                        bool created,
                        const std::vector<std::string>& data_files);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_COMMITTER_H_
