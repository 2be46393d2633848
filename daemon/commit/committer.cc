// Copyright 2026 The ckptd Authors.
#include "daemon/commit/committer.h"

#include <utility>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/metadata/metadata.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

absl::StatusOr<PreparedDirectory> PrepareDirectory(
    const CommitterOptions& options, const std::string& dir, bool check_marker,
    bool overwrite, const format::StepCheck& before_remove) {
  PreparedDirectory out;
  // Opened beneath its root (no symlinks); each new component durable in
  // its parent.
  ASSIGN_OR_RETURN(
      out.dir, CheckpointDir::Open(options.env, options.checkpoint_roots, dir,
                                   /*create=*/true, &out.created));
  if (check_marker) {
    RETURN_IF_ERROR(format::PrepareCheckpointDir({options.env, /*sync=*/true},
                                                 out.dir->io_path(), overwrite,
                                                 before_remove, dir));
  }
  return out;
}

CommitResult Commit(const CommitterOptions& options, const std::string& dir,
                    const std::string& io_dir, const WritePlan& plan,
                    format::Metadata skeleton,
                    absl::Span<const RankIndex* const> indexes,
                    std::vector<format::StorageInfo> infos,
                    const format::StepCheck& before_publish) {
  const format::CommitProtocolOptions protocol{options.env, options.fsync};
  CommitResult out;
  // 3. The data files' directory entries.
  out.status = format::SyncDataFileEntries(protocol, io_dir);
  if (out.status.ok() && before_publish) out.status = before_publish();
  if (!out.status.ok()) return out;
  // storage_data in plan order: rank order, each rank's items in index
  // order, as the writers laid them out.
  std::vector<size_t> order(plan.plan.items.size());
  for (size_t p = 0; p < order.size(); ++p) order[p] = p;
  format::Metadata metadata = std::move(skeleton);
  format::AppendStorageData(
      plan.plan,
      [&](const format::PlannedItem& pi) -> const format::ItemDesc& {
        return indexes[pi.rank]->items[pi.item_index];
      },
      order, absl::MakeSpan(infos), &metadata);
  format::StorageMeta sm;
  sm.checkpoint_id = dir;
  metadata.storage_meta = sm;
  absl::StatusOr<std::string> bytes = format::EncodeMetadata(metadata, {});
  if (!bytes.ok()) {
    out.status = bytes.status();
    return out;
  }
  // 4–6.
  absl::StatusOr<uint64_t> published = format::PublishMetadata(
      protocol, io_dir, *bytes, nullptr, &out.marker_may_remain);
  out.status = published.status();
  if (published.ok()) out.metadata_bytes = *published;
  return out;
}

void RemoveAttemptFiles(const CommitterOptions& options,
                        const std::string& checkpoint, CheckpointDir* dir,
                        bool created,
                        const std::vector<std::string>& data_files) {
  Env* env = options.env;
  for (const std::string& f : data_files) {
    if (absl::Status s = env->RemoveFile(f); !s.ok() && !absl::IsNotFound(s)) {
      spdlog::error("cleanup of {}: {}", f, s);
    }
  }
  if (dir != nullptr) {
    (void)env->RemoveFile(JoinPath(dir->io_path(), format::kMetadataTmpName));
    if (created) (void)dir->RemoveIfEmpty();
  }
  spdlog::info("checkpoint {}: cleaned up ({} data files removed)", checkpoint,
               data_files.size());
}

}  // namespace ckptd::daemon
