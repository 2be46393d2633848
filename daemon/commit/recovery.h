// Copyright 2026 The ckptd Authors.
//
// Start-up recovery: settles every attempt the journal (journal.h) still
// names — the daemon stopped before its step 7 (docs/durability.md):
//
//   a save whose directory holds `.metadata`   committed before the crash
//                                              (steps 5–6 done): kept,
//                                              recorded in the history
//   a save without `.metadata`                 its data files removed (a
//                                              node's: only its ranks')
//   a retention deletion                       finished
//   an entry naming a directory outside the    left alone and reported
//   roots, or damaged
//
// Directories are opened beneath their root through their fd
// (CheckpointDir); nothing outside the roots is touched. I/O only; call
// before the daemon serves.
#ifndef CKPTD_DAEMON_COMMIT_RECOVERY_H_
#define CKPTD_DAEMON_COMMIT_RECOVERY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon {

// What start-up recovery found in the journal of unfinished checkpoints.
struct RecoveryReport {
  std::vector<std::string> removed;    // unfinished: data files removed
  std::vector<std::string> completed;  // had .metadata (crash after commit)
  std::vector<std::string> errors;     // could not be cleaned up
};

struct Recovered {
  RecoveryReport report;
  // Attempts found committed: the caller records them in the history, then
  // removes their journal entry (step 7 of docs/durability.md).
  struct Commit {
    CommitRecord record;
    std::string journal_path;
  };
  std::vector<Commit> committed;
};

// Settles every entry of `journal_dir`: removed once settled, kept when the
// cleanup failed (retried at the next start), and left for the caller for
// a committed attempt.
absl::StatusOr<Recovered> RecoverJournal(Env* env,
                                         const std::string& journal_dir,
                                         const std::vector<std::string>& roots);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_RECOVERY_H_
