// Copyright 2026 The ckptd Authors.

#include "daemon/commit/checkpoint_dir.h"

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
#include "daemon/commit/paths.h"
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

namespace {

// The root `dir` lies below (the longest; roots are operator-given: they
// alone are resolved with symlinks, through the Env).
absl::StatusOr<std::string> RootOf(Env* env,
                                   const std::vector<std::string>& roots,
                                   const std::string& dir) {
  std::string root;
  for (const std::string& r : roots) {
    absl::StatusOr<std::string> real = env->RealPath(r);
    const std::string path = real.ok() ? *real : r;
    if (IsStrictlyBelow(dir, path) && path.size() > root.size()) root = path;
  }
  if (root.empty()) {
    return absl::PermissionDeniedError(
        fmt::format("checkpoint path {} is not below a checkpoint root", dir));
  }
  return root;
}

// Creates component `part` in the directory `fd` (`walked`: the path of
// `part`) through the Env (fault injection, durability tracking), anchored
// to the parent's fd, and makes the new entry durable.
absl::Status CreateComponent(Env* env, int fd, const std::string& part,
                             const std::string& walked) {
  absl::Status s = env->CreateDirs(FdPath(fd) + "/" + part);
  if (s.ok()) s = env->SyncDir(FdPath(fd));
  if (s.ok()) return s;
  // Named as the operator knows it, not by its fd path.
  std::string parent_path = walked.substr(0, walked.size() - part.size() - 1);
  if (parent_path.empty()) parent_path = "/";
  return absl::Status(
      s.code(), absl::StrReplaceAll(s.message(), {{FdPath(fd), parent_path}}));
}

absl::Status OpenError(int err, const std::string& dir,
                       const std::string& walked) {
  if (err == ELOOP || err == ENOTDIR) {
    return absl::PermissionDeniedError(
        fmt::format("checkpoint path {}: {} is now a symlink or not a "
                    "directory (changed after the save "
                    "was accepted?); nothing is written through it",
                    dir, walked));
  }
  if (err == ENOENT)
    return absl::NotFoundError(fmt::format("{} does not exist", walked));
  return absl::ErrnoToStatus(err, fmt::format("open {}", walked));
}

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointDir>> CheckpointDir::Open(
    Env* env, const std::vector<std::string>& roots, const std::string& dir,
    bool create, bool* created) {
  if (created != nullptr) *created = false;
  ASSIGN_OR_RETURN(std::string root, RootOf(env, roots, dir));
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
  auto close_all = [&] {
    ::close(fd);
    if (parent >= 0) ::close(parent);
  };
  std::string walked = root;
  std::vector<std::string> parts = absl::StrSplit(
      dir.substr(root == "/" ? 1 : root.size() + 1), '/', absl::SkipEmpty());
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    walked += (walked == "/" ? "" : "/") + part;
    int next = ::openat(fd, part.c_str(), kDirFlags);
    if (next < 0 && errno == ENOENT && create) {
      if (absl::Status s = CreateComponent(env, fd, part, walked); !s.ok()) {
        close_all();
        return s;
      }
      if (created != nullptr && i + 1 == parts.size()) *created = true;
      next = ::openat(fd, part.c_str(), kDirFlags);
    }
    if (next < 0) {
      const int err = errno;
      close_all();
      return OpenError(err, dir, walked);
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
