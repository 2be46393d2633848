// Copyright 2026 The ckptd Authors.
#include "daemon/commit/journal.h"

#include <unistd.h>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/commit/state_record.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

absl::Status Journal::Init() {
  return CreateDirsDurably(options_.env, options_.dir);
}

absl::StatusOr<std::string> Journal::Add(const CommitRecord& record) {
  const std::string path = JoinPath(
      options_.dir,
      fmt::format("{}-{}-{}.journal", absl::ToUnixMillis(options_.clock->Now()),
                  ::getpid(), counter_.fetch_add(1) + 1));
  RETURN_IF_ERROR(WriteFileAtomic(options_.env, path, EncodeJournal(record)));
  return path;
}

void Journal::Remove(const std::string& path) {
  if (path.empty()) return;
  if (absl::Status s = options_.env->RemoveFile(path);
      !s.ok() && !absl::IsNotFound(s)) {
    spdlog::error(
        "journal: could not remove {}: {} (the next start settles it again)",
        path, s);
  }
}

}  // namespace ckptd::daemon
