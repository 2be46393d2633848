// Copyright 2026 The ckptd Authors.

#include "daemon/checkpoint_dir.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/paths.h"
#include "fmt/format.h"

namespace ckptd::daemon {
namespace {

std::string FdPath(int fd) { return fmt::format("/proc/self/fd/{}", fd); }

}  // namespace

CheckpointDir::CheckpointDir(std::string dir, int fd, int parent_fd,
                             std::string name)
    : dir_(std::move(dir)),
      fd_(fd),
      parent_fd_(parent_fd),
      name_(std::move(name)),
      io_path_(FdPath(fd)) {}

CheckpointDir::~CheckpointDir() {
  ::close(fd_);
  ::close(parent_fd_);
}

absl::Status CheckpointDir::RemoveIfEmpty() {
  if (::unlinkat(parent_fd_, name_.c_str(), AT_REMOVEDIR) != 0 &&
      errno != ENOENT) {
    return absl::ErrnoToStatus(errno, fmt::format("rmdir {}", dir_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointDir>> CheckpointDir::Open(
    Env* env, const std::vector<std::string>& roots, const std::string& dir,
    bool create, bool* created) {
  if (created != nullptr) *created = false;
  // The root the resolved directory lies below (roots are operator-given:
  // they alone are resolved with symlinks).
  std::string root;
  for (const std::string& r : roots) {
    char buf[PATH_MAX];
    const std::string real =
        ::realpath(r.c_str(), buf) != nullptr ? std::string(buf) : r;
    if (IsStrictlyBelow(dir, real) && real.size() > root.size()) root = real;
  }
  if (root.empty()) {
    return absl::PermissionDeniedError(
        fmt::format("checkpoint path {} is not below a checkpoint root", dir));
  }
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && create) {
    // The root itself (operator-configured) is made on first use.
    RETURN_IF_ERROR(CreateDirsDurably(env, root));
    fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (fd < 0)
    return absl::ErrnoToStatus(errno,
                               fmt::format("open checkpoint root {}", root));
  int parent = -1;
  std::string walked = root;
  std::vector<std::string> parts = absl::StrSplit(
      dir.substr(root == "/" ? 1 : root.size() + 1), '/', absl::SkipEmpty());
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    walked += (walked == "/" ? "" : "/") + part;
    int next = ::openat(fd, part.c_str(),
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT && create) {
      // Through the Env (fault injection, durability tracking), anchored to
      // the parent's fd; then the new entry made durable.
      absl::Status s = env->CreateDirs(FdPath(fd) + "/" + part);
      if (s.ok()) s = env->SyncDir(FdPath(fd));
      if (!s.ok()) {
        // Named as the operator knows it, not by its fd path.
        const std::string parent_path = walked.substr(0, walked.size() - part.size() - 1);
        s = absl::Status(s.code(), absl::StrReplaceAll(s.message(),
                                                       {{FdPath(fd), parent_path.empty()
                                                                         ? std::string("/")
                                                                         : parent_path}}));
        ::close(fd);
        if (parent >= 0) ::close(parent);
        return s;
      }
      if (created != nullptr && i + 1 == parts.size()) *created = true;
      next = ::openat(fd, part.c_str(),
                      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (next < 0) {
      const int err = errno;
      ::close(fd);
      if (parent >= 0) ::close(parent);
      if (err == ELOOP || err == ENOTDIR) {
        return absl::PermissionDeniedError(
            fmt::format("checkpoint path {}: {} is now a symlink or not a "
                        "directory (changed after the "
                        "save was accepted?); nothing is written through it",
                        dir, walked));
      }
      if (err == ENOENT)
        return absl::NotFoundError(fmt::format("{} does not exist", walked));
      return absl::ErrnoToStatus(err, fmt::format("open {}", walked));
    }
    if (parent >= 0) ::close(parent);
    parent = fd;
    fd = next;
  }
  if (parent < 0) {
    ::close(fd);
    return absl::PermissionDeniedError(
        fmt::format("{} is a checkpoint root itself", dir));
  }
  return std::unique_ptr<CheckpointDir>(
      new CheckpointDir(dir, fd, parent, parts.back()));
}

}  // namespace ckptd::daemon
