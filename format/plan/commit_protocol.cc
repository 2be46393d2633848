// Copyright 2026 The ckptd Authors.
#include "format/plan/commit_protocol.h"

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/metadata/metadata.h"

namespace ckptd::format {
namespace {

absl::Status RemoveIfPresent(Env* env, const std::string& path) {
  absl::Status s = env->RemoveFile(path);
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

}  // namespace

absl::Status PrepareCheckpointDir(const CommitProtocolOptions& options,
                                  const std::string& dir, bool overwrite,
                                  const StepCheck& before_remove,
                                  std::string_view display_dir) {
  Env* env = options.env;
  const std::string marker = JoinPath(dir, kMetadataName);
  absl::Status exists = env->FileExists(marker);
  if (absl::IsNotFound(exists)) return absl::OkStatus();
  RETURN_IF_ERROR(exists);
  if (!overwrite) {
    return absl::FailedPreconditionError(
        fmt::format("{} already holds a committed checkpoint (save with "
                    "overwrite to replace it)",
                    display_dir.empty() ? std::string_view(dir) : display_dir));
  }
  if (before_remove) RETURN_IF_ERROR(before_remove());
  RETURN_IF_ERROR(env->RemoveFile(marker));
  // Durably gone before any new data file exists: a crash can never pair
  // the old marker with new data.
  return env->SyncDir(dir);
}

absl::Status SyncDataFileEntries(const CommitProtocolOptions& options,
                                 const std::string& dir) {
  return options.sync ? options.env->SyncDir(dir) : absl::OkStatus();
}

absl::StatusOr<uint64_t> PublishMetadata(const CommitProtocolOptions& options,
                                         const std::string& dir,
                                         std::string_view metadata,
                                         const StepCheck& before_rename,
                                         bool* marker_may_remain) {
  if (marker_may_remain != nullptr) *marker_may_remain = false;
  Env* env = options.env;
  const std::string tmp = JoinPath(dir, kMetadataTmpName);
  const std::string marker = JoinPath(dir, kMetadataName);
  // 4. .metadata.tmp, durably.
  absl::Status s = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
                     env->NewWritableFile(tmp));
    absl::Status w = f->Append(metadata);
    if (w.ok() && options.sync) w = f->Sync();
    absl::Status c = f->Close();
    return w.ok() ? c : w;
  }();
  // 5. The pre-rename check, then the commit point.
  if (s.ok() && before_rename) s = before_rename();
  if (s.ok()) s = env->RenameFile(tmp, marker);
  if (!s.ok()) {
    (void)RemoveIfPresent(env, tmp);  // best effort: never a marker
    return s;
  }
  // 6. The rename, durably.
  if (options.sync) {
    if (absl::Status d = env->SyncDir(dir); !d.ok()) {
      absl::Status u = UnpublishMetadata(options, dir);
      if (!u.ok() && marker_may_remain != nullptr) *marker_may_remain = true;
      return u.ok()
                 ? d
                 : absl::Status(
                       d.code(),
                       fmt::format("{}; un-publishing .metadata failed too: {}",
                                   d.message(), u.message()));
    }
  }
  return metadata.size();
}

absl::Status UnpublishMetadata(const CommitProtocolOptions& options,
                               const std::string& dir) {
  Env* env = options.env;
  absl::Status first = RemoveIfPresent(env, JoinPath(dir, kMetadataName));
  absl::Status tmp = RemoveIfPresent(env, JoinPath(dir, kMetadataTmpName));
  if (first.ok()) first = tmp;
  // The removal, durably (attempted even if a removal failed: what did go
  // must stay gone).
  if (options.sync) {
    absl::Status d = env->SyncDir(dir);
    if (first.ok()) first = d;
  }
  return first;
}

}  // namespace ckptd::format
