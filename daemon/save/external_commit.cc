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
#include "fmt/ranges.h"
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

// Single-node: the bytes to the attempt's commit task (tasks::RunCommit).
absl::Status HandOverLocked(SaveCore& core,
                            const std::shared_ptr<Checkpoint>& c,
                            std::string metadata)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu) {
  spdlog::info("checkpoint {}: .metadata of {} bytes handed over", c->dir,
               metadata.size());
  c->awaiting_metadata_since = absl::InfinitePast();
  c->external_bytes = std::move(metadata);
  attempt::SubmitLocked(
      core, c, [&core, c]() mutable { tasks::RunCommit(core, std::move(c)); });
  return absl::OkStatus();
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
  if (c->multi && !c->is_coordinator) {
    return absl::FailedPreconditionError(fmt::format(
        "{}: checkpoint {} spans {} nodes; DCP's .metadata goes to the "
        "daemon of rank 0's node (the coordinator, {}), not to this node's "
        "(ranks [{}])",
        what, c->dir, c->cluster.num_nodes, c->cluster.coordinator,
        fmt::join(c->local, ", ")));
  }
  RETURN_IF_ERROR(CheckAwaiting(*c, what));
  return c;
}

absl::StatusOr<Layout> GetLayout(SaveCore& core, std::string_view id,
                                 uint64_t arena_id) {
  const absl::StatusOr<std::string> resolved = Resolve(core, id);
  const std::shared_ptr<const Arena> arena = FindArena(core, arena_id);
  Layout out;
  {
    absl::MutexLock l(&core.mu);
    ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> c,
                     AwaitingMetadataLocked(core, id, resolved, arena.get(),
                                            arena_id, "GetLayout"));
    out.checkpoint_id = c->dir;
    if (!c->multi) {
      out.entries = LayoutOf(c->plan, c->AllIndexes(), c->infos);
      return out;
    }
  }
  // Multi-node, on the coordinator's node: every node's items (not under
  // core.mu: the coordinator takes its own lock).
  ASSIGN_OR_RETURN(out.entries,
                   core.coordinator->GlobalLayout(out.checkpoint_id));
  return out;
}

absl::Status CommitMetadata(SaveCore& core, std::string_view id,
                            uint64_t arena_id, std::string metadata) {
  const absl::StatusOr<std::string> resolved = Resolve(core, id);
  const std::shared_ptr<const Arena> arena = FindArena(core, arena_id);
  std::shared_ptr<Checkpoint> c;
  {
    absl::MutexLock l(&core.mu);
    ASSIGN_OR_RETURN(c, AwaitingMetadataLocked(core, id, resolved, arena.get(),
                                               arena_id, "CommitMetadata"));
    if (!c->multi) return HandOverLocked(core, c, std::move(metadata));
  }
  // Multi-node, on the coordinator's node: the coordinator checks the bytes
  // against every node's layout and publishes them; the answer to this
  // node's Prepare carries the outcome.
  RETURN_IF_ERROR(
      core.coordinator->CommitMetadata(c->dir, std::move(metadata)));
  absl::MutexLock l(&core.mu);
  c->awaiting_metadata_since = absl::InfinitePast();
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
  // Multi-node: the coordinator keeps metadata_timeout for every node.
  if (c->multi || c->awaiting_metadata_since == absl::InfinitePast() ||
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
