// Copyright 2026 The ckptd Authors.
//
// DCP's StorageWriter (SaveOptions.external_metadata): the data files are
// the daemon's, the `.metadata` is what DCP's coordinator handed
// StorageWriter.finish. Before publishing those bytes the daemon checks
// that they describe exactly what it wrote — a client cannot commit a
// marker that points readers at bytes the attempt did not write.
//
//   LayoutOf          where each written item is (GetLayout's answer, and
//                     what the check compares with)
//   CheckExternal…    the decoded `.metadata` against that layout
//   CommitExternal    steps 3–6 (docs/durability.md) with the given bytes
//
// Takes: WritePlan (plan/), the writers' StorageInfos (write/); hands on
// the commit (or the error) to the orchestrator. Pure functions.
#ifndef CKPTD_DAEMON_COMMIT_EXTERNAL_METADATA_H_
#define CKPTD_DAEMON_COMMIT_EXTERNAL_METADATA_H_

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/commit/committer.h"
#include "daemon/types/save_types.h"
#include "format/metadata/metadata.h"

namespace ckptd::daemon {

// Every planned (written) item's storage_data key and location, in plan
// order: `indexes[rank]` are the ranks' items, `infos[p]` the writers'
// result for plan item p.
std::vector<LayoutEntry> LayoutOf(const WritePlan& plan,
                                  absl::Span<const RankIndex* const> indexes,
                                  absl::Span<const format::StorageInfo> infos);

// FAILED_PRECONDITION naming the first difference unless `metadata`
// describes exactly `layout`: every written item has its storage_data
// entry with the same file, offset, length and transforms, and nothing
// else is in storage_data; every tensor chunk of state_dict_metadata is a
// written chunk of that fqn with the same dtype and global shape as
// written, every BytesStorageMetadata a written bytes item, and every
// written item is in state_dict_metadata.
//
// The general form: `items[p]` describes the item `layout[p]` places, in
// the plan order of any plan (one node's, or a multi-node coordinator's
// over every node: cluster/coordinator.h).
absl::Status CheckExternalMetadata(
    const format::Metadata& metadata,
    absl::Span<const format::ItemDesc* const> items,
    absl::Span<const LayoutEntry> layout);
// One node's plan: items from its WritePlan and its ranks' indexes.
absl::Status CheckExternalMetadata(const format::Metadata& metadata,
                                   const WritePlan& plan,
                                   absl::Span<const RankIndex* const> indexes,
                                   absl::Span<const LayoutEntry> layout);

// `bytes` decoded with the restricted decoder (never unpickled);
// INVALID_ARGUMENT "cannot be decoded" naming why.
absl::StatusOr<format::Metadata> DecodeExternalMetadata(std::string_view bytes);

// Steps 3–6 of a single-node external_metadata checkpoint in `io_dir`: the
// data files' entries synced, `bytes` decoded (never unpickled) and checked
// (CheckExternalMetadata), then published as given. `before_publish` runs
// after step 3, as in Commit.
CommitResult CommitExternal(const CommitterOptions& options,
                            const std::string& io_dir, const WritePlan& plan,
                            absl::Span<const RankIndex* const> indexes,
                            absl::Span<const format::StorageInfo> infos,
                            std::string_view bytes,
                            const format::StepCheck& before_publish);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_EXTERNAL_METADATA_H_
