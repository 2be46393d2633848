// Copyright 2026 The ckptd Authors.
//
// The commit of external metadata: DCP's StorageWriter (SaveOptions
// .external_metadata; docs/storage-writer.md). The attempt writes its data
// files as any other, then — instead of publishing its own `.metadata` —
// waits (metadata_timeout) for the one DCP's coordinator hands
// StorageWriter.finish:
//
//   every local rank written → DataDurableLocked (until_data_durable
//     waiters answered) → GetLayout (where each item landed, for
//     storage_data) → CommitMetadata (the pickled Metadata) →
//     tasks::RunCommit checks and publishes it (commit/external_metadata.h)
//   every tick: TickMetadataLocked (metadata_timeout)
#ifndef CKPTD_DAEMON_SAVE_EXTERNAL_COMMIT_H_
#define CKPTD_DAEMON_SAVE_EXTERNAL_COMMIT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tasks.h"
#include "daemon/arena/arena_registry.h"
#include "daemon/save/attempt.h"
#include "daemon/save/save_core.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon::save::external_commit {

// Where the items of external_metadata checkpoint `id` were written
// (CheckpointManager::GetLayout); the caller's arena names its uid.
absl::StatusOr<Layout> GetLayout(SaveCore& core, std::string_view id,
                                 uint64_t arena_id);
// The `.metadata` of `id`, handed over: its commit task is submitted
// (CheckpointManager::CommitMetadata).
absl::Status CommitMetadata(SaveCore& core, std::string_view id,
                            uint64_t arena_id, std::string metadata);
// The external_metadata attempt `id` names, awaiting its `.metadata`, if
// the caller (`arena`) is its saver; else the precise error for `what`.
absl::StatusOr<std::shared_ptr<Checkpoint>> AwaitingMetadataLocked(
    SaveCore& core, std::string_view id,
    const absl::StatusOr<std::string>& resolved, const Arena* arena,
    uint64_t arena_id, std::string_view what)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

// An external_metadata attempt's data is durable: it now awaits
// CommitMetadata; until_data_durable waiters are answered.
void DataDurableLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                       Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// Fails an attempt that awaited its `.metadata` beyond metadata_timeout.
void TickMetadataLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                        absl::Time now, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

}  // namespace ckptd::daemon::save::external_commit

#endif  // CKPTD_DAEMON_SAVE_EXTERNAL_COMMIT_H_
