// Copyright 2026 The ckptd Authors.
//
// The journal of unfinished attempts: state_dir/journal/<ms>-<pid>-<n>.journal,
// one checksummed CommitRecord (save_types.h, encoded by state_record.h)
// per attempt at a checkpoint directory and per retention deletion. Step 0
// of docs/durability.md writes an entry durably before the attempt touches
// its directory; step 7 removes it after the commit (or after its files
// were removed). Recovery (recovery.h) finishes or undoes what an entry
// names after a crash.
//
// Thread-safe (entries are independent files with unique names).
#ifndef CKPTD_DAEMON_COMMIT_JOURNAL_H_
#define CKPTD_DAEMON_COMMIT_JOURNAL_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/env.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon {

struct JournalOptions {
  Env* env = nullptr;
  std::string dir;  // state_dir/journal
  Clock* clock = Clock::Real();
};

class Journal {
 public:
  explicit Journal(JournalOptions options) : options_(std::move(options)) {}

  // Creates the directory durably.
  absl::Status Init();
  // Step 0: a new entry, durably (tmp → fsync → rename → fsync dir).
  // Returns its path, for Remove.
  absl::StatusOr<std::string> Add(const CommitRecord& record);
  // Step 7 (or the end of a cleanup): the entry goes; a failure is logged
  // (recovery then finds a finished attempt and settles it again).
  void Remove(const std::string& path);

  const std::string& dir() const { return options_.dir; }

 private:
  const JournalOptions options_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_JOURNAL_H_
