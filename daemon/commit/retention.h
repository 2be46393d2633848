// Copyright 2026 The ckptd Authors.
//
// Retention: the history of committed checkpoints (state_dir/history, one
// checksummed HistoryRecord per (Unix user, job)) and the rule of what a
// commit may prune.
//
// Who may prune what: the commit of a checkpoint of job J by Unix user U in
// directory P/name may delete only checkpoints this daemon recorded as
// committed for the same J by the same U in the same parent P, under the
// checkpoint roots, never the newest one, and none of a user it does not
// know (kUnknownUid: history of earlier versions, saves without an arena).
//
//   History::Record     the rule, pure: records a commit and picks what
//                       keep_last_n (and keep_every) lets go
//   WriteHistory        the (uid, job) record, atomically
//   DeleteCommitted     one pruned checkpoint, journaled (a crash midway
//                       leaves an entry recovery finishes)
//   DeleteCheckpointFiles  marker (durably) then data files, beneath the
//                       root through the directory's fd; shared with
//                       recovery
//
// History is thread-compatible (the orchestrator guards it); the functions
// do I/O and take no lock.
#ifndef CKPTD_DAEMON_COMMIT_RETENTION_H_
#define CKPTD_DAEMON_COMMIT_RETENTION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/env.h"
#include "daemon/commit/journal.h"
#include "daemon/commit/state_record.h"

namespace ckptd::daemon {

// What a commit's retention keeps (History::Record).
struct RetentionRule {
  int keep_last_n = 0;     // <= 0: the daemon's keep_last_n (SettleCommit)
  int64_t keep_every = 0;  // 0: none
};

class History {
 public:
  // A record read at start-up (LoadHistoryRecords).
  void Load(HistoryRecord record);

  struct Recorded {
    HistoryRecord record;             // to persist (WriteHistory)
    std::vector<std::string> doomed;  // to delete, oldest first
  };
  // `dir`, whose save started at `started_ms` (0: unknown), committed for
  // (uid, job); keep_last_n <= 0 prunes nothing. The history is ordered by
  // when saves started, not when they committed: an asynchronous save that
  // commits after a later one is still the older, and retention keeps the
  // newest saves (a late commit of step 6 never evicts step 8).
  // keep_every > 0 (Orbax's keep_period) also keeps, beyond the newest
  // keep_last_n, every checkpoint whose directory name ends with a step
  // that is a multiple of it (StepOf: "step_1200"), as `ckptctl gc
  // --keep-every` does.
  Recorded Record(const std::string& job, int64_t uid, const std::string& dir,
                  int64_t started_ms, int keep_last_n, int64_t keep_every = 0);

  // (job, dir) of every recorded commit of `job` (every job if empty).
  std::vector<std::pair<std::string, std::string>> Committed(
      std::string_view job) const;

 private:
  struct Entry {
    std::string dir;
    int64_t started_ms = 0;
  };
  using Key = std::pair<int64_t, std::string>;         // (uid, job)
  absl::flat_hash_map<Key, std::vector<Entry>> dirs_;  // oldest first
};

// Every readable history record in `history_dir`; damaged ones are logged
// and skipped (their checkpoints are then never pruned).
std::vector<HistoryRecord> LoadHistoryRecords(Env* env,
                                              const std::string& history_dir);
absl::Status WriteHistory(Env* env, const std::string& history_dir,
                          const HistoryRecord& record);

// Removes a checkpoint directory's commit marker (durably) and data files,
// then the directory if that left it empty. With `ranks` (a node of a
// multi-node checkpoint), only those ranks' data files and no marker.
// Nothing outside the roots is ever removed (CheckpointDir).
absl::Status DeleteCheckpointFiles(Env* env,
                                   const std::vector<std::string>& roots,
                                   const std::string& dir,
                                   const std::vector<int>* ranks = nullptr);

// A retention deletion of committed `dir`, journaled.
absl::Status DeleteCommitted(Env* env, Journal& journal,
                             const std::vector<std::string>& roots,
                             const std::string& dir, const std::string& job,
                             int64_t uid);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_RETENTION_H_
