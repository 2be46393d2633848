// Copyright 2026 The ckptd Authors.
#include "daemon/commit/recovery.h"

#include <algorithm>
#include <optional>

#include "absl/strings/escaping.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/commit/checkpoint_dir.h"
#include "daemon/commit/paths.h"
#include "daemon/commit/retention.h"
#include "daemon/commit/state_record.h"
#include "fmt/format.h"
#include "format/metadata/metadata.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

// The entry at `path`, if it names a directory under the roots.
absl::StatusOr<CommitRecord> ReadEntry(Env* env, const std::string& path,
                                       const std::vector<std::string>& roots) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path, 1 << 16));
  ASSIGN_OR_RETURN(CommitRecord rec, DecodeJournal(text, path));
  // Only a directory under the roots is ever touched (an entry of an
  // earlier version could have been injected through a name).
  absl::StatusOr<std::string> resolved =
      ResolveCheckpointDir(roots, rec.dir, env);
  if (!resolved.ok() || *resolved != rec.dir) {
    return absl::DataLossError(fmt::format(
        "{}: names {}, which is not a checkpoint directory under the roots{}",
        path, absl::CHexEscape(rec.dir),
        resolved.ok() ? ""
                      : fmt::format(" ({})", resolved.status().message())));
  }
  if (rec.ranks) std::sort(rec.ranks->begin(), rec.ranks->end());
  return rec;
}

// Whether `dir` holds `.metadata`, looked up through the directory's fd.
absl::StatusOr<bool> HasMarker(Env* env, const std::vector<std::string>& roots,
                               const std::string& dir) {
  absl::StatusOr<std::unique_ptr<CheckpointDir>> opened =
      CheckpointDir::Open(env, roots, dir, /*create=*/false);
  if (absl::IsNotFound(opened.status())) return false;
  RETURN_IF_ERROR(opened.status());
  absl::Status e =
      env->FileExists(JoinPath((*opened)->io_path(), format::kMetadataName));
  if (absl::IsNotFound(e)) return false;
  RETURN_IF_ERROR(e);
  return true;
}

}  // namespace

absl::StatusOr<bool> SettleJournalEntry(Env* env,
                                        const std::vector<std::string>& roots,
                                        const CommitRecord& rec,
                                        const std::string& journal_path) {
  const std::string& dir = rec.dir;
  ASSIGN_OR_RETURN(const bool marker,
                   rec.deleting ? false : HasMarker(env, roots, dir));
  if (marker) {
    spdlog::info("recovery: {} was committed before the daemon stopped", dir);
    return true;
  }
  RETURN_IF_ERROR(DeleteCheckpointFiles(env, roots, dir,
                                        rec.ranks ? &*rec.ranks : nullptr));
  spdlog::warn("recovery: removed the unfinished checkpoint {} (no .metadata)",
               dir);
  (void)env->RemoveFile(journal_path);
  return false;
}

absl::StatusOr<Recovered> RecoverJournal(const RecoveryOptions& options) {
  Env* env = options.env;
  const std::vector<std::string>& roots = options.roots;
  Recovered out;
  ASSIGN_OR_RETURN(std::vector<std::string> names,
                   env->ListDir(options.journal_dir));
  for (const std::string& n : names) {
    const std::string path = JoinPath(options.journal_dir, n);
    if (!n.ends_with(".journal")) {
      (void)env->RemoveFile(path);  // a .tmp of an interrupted step 0
      continue;
    }
    if (absl::StatusOr<uint64_t> size = env->GetFileSize(path);
        size.ok() && *size == 0) {
      (void)env->RemoveFile(path);
      continue;
    }
    absl::StatusOr<CommitRecord> rec = ReadEntry(env, path, roots);
    if (!rec.ok()) {
      out.report.errors.push_back(std::string(rec.status().message()));
      spdlog::error("recovery: journal entry ignored, nothing removed: {}",
                    rec.status());
      continue;  // left for an operator
    }
    const std::string& dir = rec->dir;
    if (rec->deleting) {
      spdlog::warn(
          "recovery: finishing the deletion of {} (retention was interrupted)",
          dir);
    }
    absl::StatusOr<bool> marker =
        rec->deleting ? false : HasMarker(env, roots, dir);
    const absl::Duration settle = rec->settle_ms > 0
                                      ? absl::Milliseconds(rec->settle_ms)
                                      : options.default_settle;
    if (marker.ok() && !*marker && rec->ranks && !rec->deleting &&
        settle > absl::ZeroDuration()) {
      // A node's share: the coordinator may still rename .metadata in
      // (this node may have prepared just before it stopped). Removing the
      // files now could tear a checkpoint being committed.
      spdlog::warn(
          "recovery: {} has no .metadata yet; this node's files of it stay "
          "for {} (its coordinator may still commit it), then .metadata "
          "decides",
          dir, absl::FormatDuration(settle));
      out.report.deferred.push_back(dir);
      out.deferred.push_back({*std::move(rec), path, options.now + settle});
      continue;
    }
    absl::StatusOr<bool> committed =
        marker.ok() ? SettleJournalEntry(env, roots, *rec, path)
                    : marker.status();
    if (!committed.ok()) {
      out.report.errors.push_back(
          fmt::format("{}: {}", dir, committed.status()));
      spdlog::error(
          "recovery: could not clean up the unfinished checkpoint {}: {}", dir,
          committed.status());
      continue;  // keep the entry: retried at the next start
    }
    if (*committed) {
      out.report.completed.push_back(dir);
      out.committed.push_back({*rec, path});
    } else {
      out.report.removed.push_back(dir);
    }
  }
  RETURN_IF_ERROR(env->SyncDir(options.journal_dir));
  return out;
}

}  // namespace ckptd::daemon
