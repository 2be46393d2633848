// Copyright 2026 The ckptd Authors.

#include "daemon/commit/paths.h"

#include <sys/stat.h>

#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/absl_fmt.h"
#include "fmt/format.h"

namespace ckptd::daemon {
namespace {

// Env::RealPath of an existing path, or NOT_FOUND. A symlink loop, a file
// used as a directory or a name too long is the caller's bad path
// (INVALID_ARGUMENT), not the daemon's failure.
absl::StatusOr<std::string> RealPath(Env* env, const std::string& p) {
  absl::StatusOr<std::string> real = env->RealPath(p);
  if (real.ok() || absl::IsNotFound(real.status())) return real;
  const absl::Status& s = real.status();
  if (absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s)) {
    return absl::InvalidArgumentError(
        fmt::format("checkpoint path {}: {}", p, s.message()));
  }
  if (absl::IsPermissionDenied(s)) {
    return absl::PermissionDeniedError(
        fmt::format("checkpoint path {}: {}", p, s.message()));
  }
  return s;
}

}  // namespace

bool IsStrictlyBelow(const std::string& path, const std::string& root) {
  if (root == "/") return path.size() > 1;
  return path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
         path[root.size()] == '/';
}

std::string NormalizePath(std::string_view path) {
  std::string out;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(path.data(), path.size()), '/',
                      absl::SkipEmpty())) {
    if (part == ".") continue;
    out += '/';
    out.append(part.data(), part.size());
  }
  return out.empty() ? "/" : out;
}

absl::StatusOr<std::string> ResolveCheckpointDir(
    const std::vector<std::string>& roots, std::string_view id, Env* env) {
  if (env == nullptr) env = Env::Default();
  if (id.empty()) return absl::InvalidArgumentError("checkpoint_id is empty");
  if (id.size() > 4096) {
    return absl::InvalidArgumentError(
        fmt::format("checkpoint_id is {} bytes; the limit is 4096", id.size()));
  }
  if (id.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError("checkpoint_id contains a NUL byte");
  }
  if (roots.empty())
    return absl::FailedPreconditionError("no checkpoint roots configured");
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(id.data(), id.size()), '/')) {
    if (part == "..") {
      return absl::PermissionDeniedError(
          fmt::format("checkpoint path '{}' contains '..'", id));
    }
  }
  const std::string lexical = NormalizePath(
      id[0] == '/' ? std::string(id) : roots[0] + "/" + std::string(id));

  // Longest existing prefix, resolved; the rest appended.
  std::string existing = lexical;
  std::string rest;
  absl::StatusOr<std::string> real = RealPath(env, existing);
  while (!real.ok() && absl::IsNotFound(real.status()) && existing != "/") {
    const size_t slash = existing.rfind('/');
    rest = existing.substr(slash) + rest;
    existing = slash == 0 ? "/" : existing.substr(0, slash);
    real = RealPath(env, existing);
  }
  if (!real.ok()) return real.status();
  if (rest.empty()) {
    struct stat st;
    if (::stat(real->c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      return absl::PermissionDeniedError(fmt::format(
          "checkpoint path '{}' exists and is not a directory", id));
    }
  }
  const std::string resolved = NormalizePath(*real + rest);
  for (const std::string& root : roots) {
    absl::StatusOr<std::string> real_root = RealPath(env, root);
    const std::string r = real_root.ok() ? *real_root : NormalizePath(root);
    if (IsStrictlyBelow(resolved, r)) return resolved;
  }
  std::string list;
  for (const std::string& root : roots)
    list += (list.empty() ? "" : ", ") + root;
  return absl::PermissionDeniedError(
      fmt::format("checkpoint path '{}' resolves to {}, which is not below a "
                  "checkpoint root ({})",
                  id, resolved, list));
}

}  // namespace ckptd::daemon
