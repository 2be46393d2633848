// Copyright 2026 The ckptd Authors.
//
// CheckpointManager::Impl, DCP's StorageWriter (SaveOptions
// .external_metadata; docs/storage-writer.md): the attempt writes its data
// files as any other, then — instead of publishing its own `.metadata` —
// waits (metadata_timeout) for the one DCP's coordinator hands
// StorageWriter.finish. GetLayout tells the client where each item landed
// (for storage_data); CommitMetadata takes the pickled Metadata and
// RunCommit (checkpoint_tasks.cc) checks and publishes it
// (commit/external_metadata.h).

#include <string>
#include <utility>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/commit/external_metadata.h"
#include "daemon/save/checkpoint_manager_impl.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

// The checkpoint's saver is the caller (its arena's uid), or nobody's
// bytes told who saved it (no host batch: any local client may).
absl::Status CheckCaller(const Checkpoint& c, const Arena* arena,
                         uint64_t arena_id, std::string_view what) {
  if (arena == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("{}: arena {} is not registered (pass the caller's arena)",
                    what, arena_id));
  }
  if (c.uid == kUnknownUid || c.uid == static_cast<int64_t>(arena->uid)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(fmt::format(
      "{}: checkpoint {} was saved by uid {}; the caller is uid {}", what,
      c.dir,
      c.uid == kMixedUid ? std::string("(several)") : fmt::format("{}", c.uid),
      arena->uid));
}

// An external_metadata attempt that awaits its .metadata, for `what`.
absl::Status CheckAwaiting(const Checkpoint& c, std::string_view what) {
  if (!c.external_metadata) {
    return absl::FailedPreconditionError(fmt::format(
        "{}: checkpoint {} was not saved with external_metadata (the daemon "
        "writes its .metadata itself)",
        what, c.dir));
  }
  if (c.awaiting_metadata_since != absl::InfinitePast()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(fmt::format(
      "{}: checkpoint {} is {}{}; it awaits its .metadata only once its data "
      "is durable (Wait with until_data_durable) and until one is handed over",
      what, c.dir, StateName(c.state),
      c.error.ok() ? "" : fmt::format(" ({})", c.error.message())));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Checkpoint>>
CheckpointManager::Impl::AwaitingMetadataLocked(
    std::string_view id, const absl::StatusOr<std::string>& resolved,
    const Arena* arena, uint64_t arena_id, std::string_view what) {
  std::shared_ptr<Checkpoint> c = FindLocked(id, resolved);
  if (!c) {
    return absl::NotFoundError(
        fmt::format("{}: no checkpoint '{}' is known", what, id));
  }
  RETURN_IF_ERROR(CheckCaller(*c, arena, arena_id, what));
  RETURN_IF_ERROR(CheckAwaiting(*c, what));
  return c;
}

absl::StatusOr<Layout> CheckpointManager::Impl::GetLayout(std::string_view id,
                                                          uint64_t arena_id) {
  const absl::StatusOr<std::string> resolved = Resolve(id);
  const std::shared_ptr<const Arena> arena = FindArena(arena_id);
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(
      std::shared_ptr<Checkpoint> c,
      AwaitingMetadataLocked(id, resolved, arena.get(), arena_id, "GetLayout"));
  Layout out;
  out.checkpoint_id = c->dir;
  out.entries = LayoutOf(c->plan, c->AllIndexes(), c->infos);
  return out;
}

absl::Status CheckpointManager::Impl::CommitMetadata(std::string_view id,
                                                     uint64_t arena_id,
                                                     std::string metadata) {
  const absl::StatusOr<std::string> resolved = Resolve(id);
  const std::shared_ptr<const Arena> arena = FindArena(arena_id);
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> c,
                   AwaitingMetadataLocked(id, resolved, arena.get(), arena_id,
                                          "CommitMetadata"));
  spdlog::info("checkpoint {}: .metadata of {} bytes handed over", c->dir,
               metadata.size());
  c->awaiting_metadata_since = absl::InfinitePast();
  c->external_bytes = std::move(metadata);
  SubmitLocked(c, [this, c]() mutable { RunCommit(std::move(c)); });
  return absl::OkStatus();
}

void CheckpointManager::Impl::DataDurableLocked(
    const std::shared_ptr<Checkpoint>& c, Deferred& d) {
  c->awaiting_metadata_since = clock_->Now();
  const CheckpointInfo info = InfoOf(*c);
  for (auto w = c->waiters.begin(); w != c->waiters.end();) {
    if (!w->until_data_durable) {
      ++w;
      continue;
    }
    d.Add(
        [done = std::move(w->done), info]() mutable { std::move(done)(info); });
    w = c->waiters.erase(w);
  }
}

void CheckpointManager::Impl::TickMetadataLocked(
    const std::shared_ptr<Checkpoint>& c, absl::Time now, Deferred& d) {
  if (c->awaiting_metadata_since == absl::InfinitePast() ||
      now - c->awaiting_metadata_since <= c->metadata_timeout) {
    return;
  }
  FailLocked(c,
             absl::DeadlineExceededError(fmt::format(
                 "no .metadata was handed over (CommitMetadata) within {} of "
                 "the data becoming durable (metadata_timeout): DCP's "
                 "StorageWriter.finish did not run — did a rank fail?",
                 absl::FormatDuration(c->metadata_timeout))),
             State::kFailed, d);
}

}  // namespace ckptd::daemon
