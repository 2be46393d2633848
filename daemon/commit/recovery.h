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
//   a node's save of a multi-node checkpoint   decided later (deferred):
//   without `.metadata`                        the coordinator may still
//                                              rename it in, up to the
//                                              entry's settle_ms after the
//                                              node's prepare, which may
//                                              have come just before the
//                                              stop; SettleJournalEntry
//                                              decides once that is over
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
#include "absl/time/time.h"
#include "common/env.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon {

// What start-up recovery found in the journal of unfinished checkpoints.
struct RecoveryReport {
  std::vector<std::string> removed;    // unfinished: data files removed
  std::vector<std::string> completed;  // had .metadata (crash after commit)
  std::vector<std::string> errors;     // could not be cleaned up
  std::vector<std::string> deferred;   // a node's share, decided later
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
  // A node's entries of multi-node checkpoints without .metadata, to be
  // decided at `due` (SettleJournalEntry); the caller keeps their
  // directories from new attempts until then.
  struct Later {
    CommitRecord record;
    std::string journal_path;
    absl::Time due;
  };
  std::vector<Later> deferred;
};

struct RecoveryOptions {
  Env* env = nullptr;  // not owned
  std::string journal_dir;
  std::vector<std::string> roots;
  // The start-up's time, and the wait of a node's entry without settle_ms
  // (the daemon's commit_timeout + peer_timeout); a zero wait decides at
  // once.
  absl::Time now;
  absl::Duration default_settle = absl::ZeroDuration();
};

// Settles every entry of the journal: removed once settled, kept when the
// cleanup failed (retried at the next start), left for the caller for a
// committed attempt, and deferred for a node's entry whose coordinator
// may still commit.
absl::StatusOr<Recovered> RecoverJournal(const RecoveryOptions& options);

// The decision on one entry (a deferred one, once due): committed (true:
// the caller records it and removes the entry, as for Recovered::committed)
// or not (false: its files and the entry removed).
absl::StatusOr<bool> SettleJournalEntry(Env* env,
                                        const std::vector<std::string>& roots,
                                        const CommitRecord& record,
                                        const std::string& journal_path);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_RECOVERY_H_
