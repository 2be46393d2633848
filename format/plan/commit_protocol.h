// Copyright 2026 The ckptd Authors.
//
// The one durability protocol of a DCP checkpoint directory: `.metadata`
// present ⇔ the checkpoint is complete. docs/durability.md numbers the
// steps once for every writer; this file implements the directory's part:
//
//   0. (daemon) the attempt's journal entry, durably      commit/journal
//   1. PrepareCheckpointDir: the directory exists durably; a stale
//      `.metadata` is refused (FAILED_PRECONDITION) or, with overwrite,
//      removed and the directory fsynced — before any data file is written
//   2. (writers) every data file written, fsynced, closed
//   3. SyncDataFileEntries: the directory fsynced (the files' names)
//   4. PublishMetadata: `.metadata.tmp` written and fsynced
//   5.   the pre-rename check (the coordinator's deadline), then the rename
//        `.metadata.tmp` → `.metadata`: the commit point
//   6.   the directory fsynced: the commit is durable
//   7. (daemon) the journal entry removed; history and retention
//
// UnpublishMetadata undoes 4–6 (a failure after the rename, an abort): it
// removes `.metadata` and `.metadata.tmp` and fsyncs the directory, and
// returns what failed — a FAILED checkpoint must never look committed.
//
// Callers: format::WriteCheckpoint (in-process writer), the daemon's
// single-node committer (daemon/commit/committer.h) and the coordinator of
// multi-node checkpoints (daemon/cluster/coordinator.h).
//
// With `sync` false (tests, CPU benchmarks) every fsync is skipped but the
// order and the atomic rename stay: `.metadata` is never written in place.
//
// Pure functions over an Env; thread-compatible (one caller per directory).
#ifndef CKPTD_FORMAT_PLAN_COMMIT_PROTOCOL_H_
#define CKPTD_FORMAT_PLAN_COMMIT_PROTOCOL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"

namespace ckptd::format {

inline constexpr char kMetadataTmpName[] = ".metadata.tmp";

struct CommitProtocolOptions {
  Env* env = nullptr;
  // fsync files and the directory (false only in tests and CPU benchmarks).
  bool sync = true;
};

// A check run at a step boundary; an error stops the protocol there.
using StepCheck = std::function<absl::Status()>;

// Step 1 for `dir`, which must exist (CreateDirsDurably or CheckpointDir).
// `before_remove` (may be empty) runs before a stale marker is removed: a
// cancelled attempt must not delete the marker of the checkpoint it was
// going to replace. Messages name `display_dir` (default: `dir`; the
// daemon's I/O paths are fd-anchored /proc/self/fd/N).
absl::Status PrepareCheckpointDir(const CommitProtocolOptions& options,
                                  const std::string& dir, bool overwrite,
                                  const StepCheck& before_remove = nullptr,
                                  std::string_view display_dir = {});

// Step 3.
absl::Status SyncDataFileEntries(const CommitProtocolOptions& options,
                                 const std::string& dir);

// Steps 4–6 with the encoded `.metadata`; returns its size. On failure
// nothing is published: a rename already done is undone. If that undo
// fails too, its error is added to the message and `*marker_may_remain`
// (when given) is set: the directory may then look committed, and the
// caller must keep the data files.
absl::StatusOr<uint64_t> PublishMetadata(
    const CommitProtocolOptions& options, const std::string& dir,
    std::string_view metadata, const StepCheck& before_rename = nullptr,
    bool* marker_may_remain = nullptr);

// Undoes steps 4–6: removes `.metadata` (the caller's own: step 1 saw to
// that) and `.metadata.tmp`, then fsyncs the directory. OK if neither was
// there.
absl::Status UnpublishMetadata(const CommitProtocolOptions& options,
                               const std::string& dir);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_PLAN_COMMIT_PROTOCOL_H_
