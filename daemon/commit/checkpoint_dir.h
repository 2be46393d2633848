// Copyright 2026 The ckptd Authors.
//
// CheckpointDir: a checkpoint directory opened once, beneath its checkpoint
// root, without following symlinks, and used through its file descriptor
// for every later step of a save (create, write, fsync, rename, remove).
//
// The daemon resolves a checkpoint path when Save arrives
// (ResolveCheckpointDir); a client that swapped a parent directory for a
// symlink afterwards could otherwise redirect the writes outside the roots.
// Open walks the resolved path from the root with openat(O_NOFOLLOW |
// O_DIRECTORY), creating missing components (each made durable by an fsync
// of its parent, through the Env), and keeps the final directory's fd. Its
// io_path() is "/proc/self/fd/<fd>": the kernel resolves it to that very
// directory whatever happens to the path's components later, so the Env's
// path-based calls (POSIX, io_uring, the fault-injecting Env) are all
// anchored to the fd.
//
// Ownership: owns two fds (the directory and its parent), closed by the
// destructor. Thread-safety: immutable after Open; RemoveIfEmpty may be
// called from any one thread.
#ifndef CKPTD_DAEMON_COMMIT_CHECKPOINT_DIR_H_
#define CKPTD_DAEMON_COMMIT_CHECKPOINT_DIR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"

namespace ckptd::daemon {

class CheckpointDir {
 public:
  // `dir` must be a resolved path (ResolveCheckpointDir) strictly below one
  // of `roots`. create: missing components are made (and *created tells
  // whether `dir` itself was); otherwise NOT_FOUND if it does not exist.
  // PERMISSION_DENIED if a component is now a symlink or not a directory.
  static absl::StatusOr<std::unique_ptr<CheckpointDir>> Open(
      Env* env, const std::vector<std::string>& roots, const std::string& dir,
      bool create, bool* created = nullptr);
  ~CheckpointDir();

  CheckpointDir(const CheckpointDir&) = delete;
  CheckpointDir& operator=(const CheckpointDir&) = delete;

  // The directory as resolved (for messages, the journal and .metadata).
  const std::string& dir() const { return dir_; }
  // The fd-anchored path to use for I/O in the directory.
  const std::string& io_path() const { return io_path_; }
  // Removes the directory if it is empty (rmdir through its parent's fd).
  absl::Status RemoveIfEmpty();

 private:
  CheckpointDir(std::string dir, int fd, int parent_fd, std::string name);
  const std::string dir_;
  const int fd_;
  const int parent_fd_;
  const std::string name_;
  const std::string io_path_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_CHECKPOINT_DIR_H_
