// Copyright 2026 The ckptd Authors.
//
// Checkpoint paths: every directory the daemon writes must resolve, symlinks
// included, under one of the configured checkpoint roots.
#ifndef CKPTD_DAEMON_COMMIT_PATHS_H_
#define CKPTD_DAEMON_COMMIT_PATHS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"

namespace ckptd::daemon {

// Resolves `id` (absolute, or relative to roots[0]) to a canonical absolute
// directory strictly below one of `roots`:
//   - INVALID_ARGUMENT: empty, NUL bytes, longer than 4096 bytes;
//   - PERMISSION_DENIED: a ".." component, or a path whose existing part
//     resolves (realpath, so symlinks are followed) outside every root, or an
//     existing non-directory.
// Components that do not exist yet are appended to the resolved existing
// prefix. `roots` must be absolute; they are resolved too. Paths are
// resolved with env->RealPath (nullptr: Env::Default()), so that a
// FaultInjectionEnv reaches them; a symlink loop or a file used as a
// directory is INVALID_ARGUMENT.
absl::StatusOr<std::string> ResolveCheckpointDir(
    const std::vector<std::string>& roots, std::string_view id,
    Env* env = nullptr);

// Whether absolute `path` lies strictly below `root` (both normalised).
bool IsStrictlyBelow(const std::string& path, const std::string& root);

// Lexically normalises an absolute path ("//a/./b/" → "/a/b"); no "..".
std::string NormalizePath(std::string_view path);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_PATHS_H_
