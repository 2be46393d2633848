// Copyright 2026 The ckptd Authors.
//
// The restores a daemon serves, as operators see them (`ckptctl restores`,
// ListRestores) and cancel them (`ckptctl cancel-restore`, CancelRestore).
//
// A restore is one load of one checkpoint by the ranks of a group: the key
// (caller uid, checkpoint directory, group string) of restore_groups. The
// Python client names its groups "<dir>#<n-th load>", so each load is its
// own restore (a job that restarts loads under the same names again: a
// group started anew, restore_groups.h, is a new restore); ranks that load
// alone (empty group) of one user and one checkpoint share an entry. Each
// restore gets an id "r<n>" when its first batch arrives and moves through
//
//   RUNNING ──every rank sent its last batch──▶ DONE
//      │    ──a batch failed for a rank──────▶ (stays RUNNING, error kept;
//      │                                        FAILED when it ends)
//      ├────CancelRestore──────────────────────▶ CANCELLED (its later batches:
//      │                                        CANCELLED; a batch 0: a new
//      │                                        restore, see Admit)
//      └────no batch for `idle_timeout`────────▶ ABANDONED
//
// Finished restores stay listed (the newest `history` of them); at most
// `max_tracked` restores are tracked at once, the oldest finished ones
// forgotten first, then the least recently active running ones (a client
// opening groups without end cannot grow the table).
//
// Takes: group keys and per-batch results from the restorer; hands on:
// RestoreProgressInfo copies (ckptctl, ListRestores). Thread-compatible:
// the restorer calls it under its lock. No I/O.
#ifndef CKPTD_DAEMON_RESTORE_RESTORE_PROGRESS_H_
#define CKPTD_DAEMON_RESTORE_RESTORE_PROGRESS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancel.h"
#include "daemon/restore/restore_types.h"

namespace ckptd::daemon {

// One restore as ListRestores reports it.
struct RestoreProgressInfo {
  std::string id;  // "r<n>", unique for the daemon's lifetime
  std::string dir;
  std::string group;  // empty: ranks restoring alone
  uint32_t uid = 0;
  int local_world_size = 1;
  std::string state;  // RUNNING, DONE, FAILED, CANCELLED, ABANDONED
  absl::Time started;
  absl::Time last_active;
  uint64_t batches = 0;        // group batches served
  uint64_t copied_bytes = 0;   // into the ranks' arenas, all ranks
  uint64_t storage_bytes = 0;  // read from storage for them
  uint64_t peer_bytes = 0;     // of them, from other daemons' memory
  int ranks_done = 0;          // ranks whose last batch was served
  std::string error;           // first failure, or the cancel reason
};

struct RestoreProgressOptions {
  absl::Duration idle_timeout = absl::Minutes(1);
  size_t history = 64;
  size_t max_tracked = 4096;
};

// One group batch as served, for Served().
struct ServedBatch {
  int ranks = 0;               // members served
  int ranks_last = 0;          // of them, ranks that sent their last batch
  uint64_t copied_bytes = 0;   // all members
  uint64_t storage_bytes = 0;  // read for the batch
  absl::Status first_error;    // of a member, if any
  uint64_t peer_bytes = 0;     // of storage_bytes, from other daemons' memory
};

class RestoreProgress {
 public:
  explicit RestoreProgress(RestoreProgressOptions options = {})
      : options_(options) {}

  // Batch `batch` of `key` arrived: the restore is found, or created (a new
  // id) when none runs for the key or `starts_anew` (a restarted job reusing
  // the group's name, restore_groups.h), and marked active. CANCELLED (with
  // the cancel reason) if the key's restore was cancelled and this is a
  // later batch of it. A batch 0 after a cancel starts a new restore: the
  // Python client names a load "<dir>#<n>" with n counted from 0 in every
  // process, so a job that failed with CANCELLED and restarted loads under
  // the same name. (A rank of the cancelled load that had not sent its first
  // batch yet starts one too; it is served at its gather deadline, the
  // ranks that were waiting having been answered CANCELLED.)
  // The restorer admits a batch only once restore_groups took it (checking
  // Admissible first), so a batch the groups refuse leaves no restore behind.
  absl::Status Admit(const RestoreKey& key, int local_world_size,
                     uint32_t batch, absl::Time now, bool starts_anew = false);
  // What Admit would answer, changing nothing.
  absl::Status Admissible(const RestoreKey& key, uint32_t batch) const;
  // A group batch of `key` was served.
  void Served(const RestoreKey& key, const ServedBatch& batch, absl::Time now);
  // Cancels restore `id`: raises its Cancellation (a batch being read
  // stops) and returns its key, for the restorer to answer what is
  // gathering. NOT_FOUND for an unknown id, FAILED_PRECONDITION if it
  // ended already.
  absl::StatusOr<RestoreKey> Cancel(const std::string& id,
                                    const std::string& reason, absl::Time now);
  // The Cancellation of the restore `key` names (raised when it is
  // cancelled), for the reads of its batches; null if none is tracked.
  std::shared_ptr<const Cancellation> CancellationOf(
      const RestoreKey& key) const;
  // Running restores idle for `idle_timeout` become ABANDONED.
  void Expire(absl::Time now);

  // Every tracked restore, running first, then the newest finished.
  std::vector<RestoreProgressInfo> List() const;
  std::optional<RestoreProgressInfo> Find(const std::string& id) const;
  size_t tracked() const { return entries_.size(); }

 private:
  struct Entry {
    RestoreProgressInfo info;
    uint64_t seq = 0;  // order of creation
    std::shared_ptr<Cancellation> cancel = std::make_shared<Cancellation>();
  };
  static bool Running(const Entry& e) { return e.info.state == "RUNNING"; }
  void Finish(Entry& e, absl::Time now);
  void Trim();

  const RestoreProgressOptions options_;
  uint64_t next_id_ = 1;
  std::map<RestoreKey, Entry> entries_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_RESTORE_PROGRESS_H_
