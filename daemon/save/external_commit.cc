// Copyright 2026 The ckptd Authors.
//
// The commit of external metadata (DCP's StorageWriter; external_commit.h):
// who may hand an attempt its `.metadata`, the layout it needs first, the
// hand-over, and metadata_timeout.
#include "daemon/save/external_commit.h"

#include <string>
#include <utility>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/commit/external_metadata.h"
#include "daemon/save/tasks.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon::save::external_commit {
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

absl::StatusOr<std::shared_ptr<Checkpoint>> AwaitingMetadataLocked(
    SaveCore& core, std::string_view id,
    const absl::StatusOr<std::string>& resolved, const Arena* arena,
    uint64_t arena_id, std::string_view what) {
  std::shared_ptr<Checkpoint> c = FindLocked(core, id, resolved);
  if (!c) {
    return absl::NotFoundError(
        fmt::format("{}: no checkpoint '{}' is known", what, id));
  }
  RETURN_IF_ERROR(CheckCaller(*c, arena, arena_id, what));
  RETURN_IF_ERROR(CheckAwaiting(*c, what));
  return c;
}

absl::StatusOr<Layout> GetLayout(SaveCore& core, std::string_view id,
                                 uint64_t arena_id) {
  const absl::StatusOr<std::string> resolved = Resolve(core, id);
  const std::shared_ptr<const Arena> arena = FindArena(core, arena_id);
  absl::MutexLock l(&core.mu);
  ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> c,
                   AwaitingMetadataLocked(core, id, resolved, arena.get(),
                                          arena_id, "GetLayout"));
  Layout out;
  out.checkpoint_id = c->dir;
  out.entries = LayoutOf(c->plan, c->AllIndexes(), c->infos);
  return out;
}

absl::Status CommitMetadata(SaveCore& core, std::string_view id,
                            uint64_t arena_id, std::string metadata) {
  const absl::StatusOr<std::string> resolved = Resolve(core, id);
  const std::shared_ptr<const Arena> arena = FindArena(core, arena_id);
  absl::MutexLock l(&core.mu);
  ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> c,
                   AwaitingMetadataLocked(core, id, resolved, arena.get(),
                                          arena_id, "CommitMetadata"));
  spdlog::info("checkpoint {}: .metadata of {} bytes handed over", c->dir,
               metadata.size());
  c->awaiting_metadata_since = absl::InfinitePast();
  c->external_bytes = std::move(metadata);
  attempt::SubmitLocked(
      core, c, [&core, c]() mutable { tasks::RunCommit(core, std::move(c)); });
  return absl::OkStatus();
}

void DataDurableLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                       Deferred& d) {
  c->awaiting_metadata_since = core.clock->Now();
  const CheckpointInfo info = attempt::InfoOf(*c);
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

void TickMetadataLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                        absl::Time now, Deferred& d) {
  if (c->awaiting_metadata_since == absl::InfinitePast() ||
      now - c->awaiting_metadata_since <= c->metadata_timeout) {
    return;
  }
  attempt::FailLocked(
      core, c,
      absl::DeadlineExceededError(fmt::format(
          "no .metadata was handed over (CommitMetadata) within {} of "
          "the data becoming durable (metadata_timeout): DCP's "
          "StorageWriter.finish did not run — did a rank fail?",
          absl::FormatDuration(c->metadata_timeout))),
      State::kFailed, d);
}

}  // namespace ckptd::daemon::save::external_commit
