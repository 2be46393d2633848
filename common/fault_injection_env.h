// Copyright 2026 The ckptd Authors.
//
// FaultInjectionEnv wraps another Env (normally Env::Default()) and
//  (a) fails chosen operations with chosen errors (ENOSPC on the 3rd append
//      to "__1_0.distcp", EIO on fsync of ".metadata.tmp", EXDEV on rename…);
//  (b) simulates a power loss: SimulateCrash() drops every byte appended but
//      not yet fsynced, deletes files whose creation was not made durable by
//      a SyncDir of their directory, and undoes renames not followed by a
//      SyncDir — what a crash may lose on a POSIX file system. Tests then
//      reopen the directory and check that only complete checkpoints remain
//      visible (house-style practice 6).
//
// Faults: rules are checked in the order added; each rule counts the calls
// it matches (op, and path containing path_substring; for a rename either
// path), lets the first `skip` through and fails the next `times`. The first
// rule that fires decides; the call then has no effect on the base Env
// (an injected Close still closes the file). The error is
// ErrnoToEnvStatus(error_number, "<op> <path>") (env.h: the mapping every Env
// uses), e.g. ENOSPC gives RESOURCE_EXHAUSTED "append /d/f: No space left on
// device", EIO UNKNOWN, ELOOP on kRealPath INVALID_ARGUMENT. ListDir,
// GetFileSize and FileExists are never failed.
//
// Crash model (deterministic; paths are compared as spelled):
//  - Files that existed before tracking started (or since the last crash)
//    are durable. Creating a file makes its entry durable only once SyncDir
//    of its directory succeeds; Sync of the file never does.
//  - Sync() records the file's size as synced; a crash truncates every
//    surviving file to its synced size. Truncation by NewWritableFile is
//    durable at once (the file restarts at 0 synced bytes).
//  - RenameFile of a file is pending until SyncDir of the target's directory
//    commits it, together with every earlier pending rename (journal order).
//    A crash undoes pending renames newest first: the file goes back to
//    `from` with its old state, and `to` gets its previous content back (or
//    disappears). A file later created at a pending rename's `from` is lost
//    when that rename is undone.
//  - RemoveFile is durable at once; it first commits pending renames through
//    the last one that names the path. RemoveDir and renames of directories
//    are durable at once and never undone.
//  - A directory made by CreateDirs is durable once SyncDir of its parent
//    succeeds; a crash before that removes it with everything in it.
//  - Tracking follows paths, not open handles: close files before renaming
//    or crashing.
//
// Thread-safe.
#ifndef CKPTD_COMMON_FAULT_INJECTION_ENV_H_
#define CKPTD_COMMON_FAULT_INJECTION_ENV_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace ckptd {

enum class FaultOp {
  kOpenWrite,
  kAppend,
  kSync,
  kClose,
  kOpenRead,
  kRead,
  kRename,
  kSyncDir,
  kRemove,
  kCreateDirs,
  kRealPath,
};

struct FaultRule {
  FaultOp op;
  // The rule applies to paths containing this substring ("" = any path).
  std::string path_substring;
  // errno to report (ENOSPC, EIO, ...); turned into a Status with
  // ErrnoToEnvStatus and the operation and path in the message.
  int error_number = 5;  // EIO
  // Skip this many matching calls before failing.
  int skip = 0;
  // Fail this many matching calls after the skipped ones (-1: forever).
  int times = 1;
};

class FaultInjectionEnv final : public Env {
 public:
  // `base` must outlive this Env.
  explicit FaultInjectionEnv(Env* base);
  ~FaultInjectionEnv() override;

  void AddRule(const FaultRule& rule);
  void ClearRules();
  // Number of faults injected so far.
  int faults_injected() const;

  // Drops unsynced data, undurable creations and renames (see above), on the
  // real files under `base`. Files opened for writing must have been closed
  // or abandoned by the caller. Resets the tracking state.
  absl::Status SimulateCrash();

  // Env interface.
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WritableFileOptions& options) override;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override;
  absl::Status CreateDirs(const std::string& dir) override;
  absl::Status RenameFile(const std::string& from,
                          const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveDir(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override;
  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override;
  absl::Status FileExists(const std::string& path) override;
  absl::StatusOr<std::string> RealPath(const std::string& path) override;

  // Used by the wrapped files; not for callers.
  absl::Status MaybeFail(FaultOp op, const std::string& path);
  void RecordAppend(const std::string& path, uint64_t new_size);
  void RecordSync(const std::string& path, uint64_t synced_size);

 private:
  struct FileState {
    uint64_t synced_size = 0;
    bool durable_entry = false;  // directory entry made durable by SyncDir
  };
  struct PendingRename {
    std::string from, to;
    // Previous content of `to`, if it existed, to restore on crash.
    bool to_existed = false;
    std::string to_backup;
    // Tracking state of `from` and of the old `to` before the rename
    // (nullopt: untracked, i.e. durable and fully synced).
    std::optional<FileState> from_state, to_state;
  };

  // Counts the call against the rules; returns the injected error, if any,
  // with `what` as its message. Matches `path` or `other_path`.
  absl::Status InjectFault(FaultOp op, std::string_view path,
                           std::string_view other_path,
                           const std::string& what);
  // Commits (forgets) the first `n` pending renames.
  void CommitRenamesLocked(size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a pending rename back on the base Env (crash recovery).
  absl::Status UndoRenameLocked(const PendingRename& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Env* const base_;
  mutable absl::Mutex mu_;
  std::vector<FaultRule> rules_ ABSL_GUARDED_BY(mu_);
  std::vector<int> rule_hits_ ABSL_GUARDED_BY(mu_);
  int faults_injected_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingRename> renames_ ABSL_GUARDED_BY(mu_);
  // Directories created since tracking began whose entry is not yet durable.
  absl::flat_hash_set<std::string> new_dirs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd

#endif  // CKPTD_COMMON_FAULT_INJECTION_ENV_H_
