// Copyright 2026 The ckptd Authors.
//
// The coordinator of multi-node checkpoints, part 3: DCP's StorageWriter
// across nodes (PlanCall.external_metadata; coordinator.h). Instead of
// writing its own .metadata once every node prepared, the coordinator
//
//   every node prepared → RunDurable: the nodes' prepares still within
//     their window, every data file visible here with its bytes, the global
//     layout (every node's items: file, offset, length, transforms) kept;
//     the coordinator's node told (AwaitDataDurable)
//   DCP's coordinator rank reads GlobalLayout, fills storage_data and hands
//     CommitMetadata the pickled Metadata → RunExternalCommit: decoded with
//     the restricted decoder, checked against the global layout
//     (commit/external_metadata.h CheckExternalMetadata), published with
//     steps 4–6 and the files checked again (Publish) → every node's
//     Prepare answered (CommitDoneLocked), or the abort
//   every tick: metadata_timeout since RunDurable (TickGlobalLocked)
#include <utility>

#include "common/absl_fmt.h"
#include "common/failpoint.h"
#include "common/status_macros.h"
#include "daemon/cluster/coordinator_impl.h"
#include "daemon/commit/external_metadata.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

std::string Unknown(std::string_view what, std::string_view id) {
  return fmt::format(
      "{}: this daemon coordinates no checkpoint '{}' (is it the daemon of "
      "rank 0's node?)",
      what, id);
}

absl::Status NotExternal(std::string_view what, const Global& g) {
  return absl::FailedPreconditionError(
      fmt::format("{}: checkpoint {} was not saved with external_metadata "
                  "(the coordinator writes its .metadata itself)",
                  what, g.dir));
}

absl::Status NotAwaiting(std::string_view what, const Global& g) {
  return absl::FailedPreconditionError(fmt::format(
      "{}: checkpoint {} of {} nodes is {}{} ({} of them prepared); it "
      "awaits its .metadata only once every node's data is durable and "
      "until one is handed over",
      what, g.dir, g.num_nodes, StateName(g.state),
      g.error.ok() ? "" : fmt::format(" ({})", g.error.message()),
      g.nodes_prepared));
}

}  // namespace

void Coordinator::Impl::AwaitDataDurable(const PeerCallId& id,
                                         DurableDone done) {
  const absl::StatusOr<std::string> dir = Resolve(id.checkpoint_id);
  Deferred d;  // before the lock: runs after it is released
  absl::MutexLock l(&mu_);
  absl::Status s;
  std::shared_ptr<Global> g = FindLocked(id.checkpoint_id, dir);
  if (!g) {
    s = absl::NotFoundError(Unknown("AwaitDataDurable", id.checkpoint_id));
  } else if (!g->external) {
    s = NotExternal("AwaitDataDurable", *g);
  } else if (absl::StatusOr<Node*> n = NodeLocked(*g, id); !n.ok()) {
    s = n.status();
  } else if (IsFinal(g->state)) {
    s = g->state == State::kCommitted ? absl::OkStatus() : g->error;
  } else if (g->awaiting_since == absl::InfinitePast() && !g->committing) {
    if (g->durable_waiter) {
      s = absl::FailedPreconditionError(fmt::format(
          "checkpoint {}: its data's durability is awaited already", g->dir));
    } else {
      g->durable_waiter = std::move(done);
      return;
    }
  }
  d.Add([done = std::move(done), s]() mutable { std::move(done)(s); });
}

absl::StatusOr<std::vector<LayoutEntry>> Coordinator::Impl::GlobalLayout(
    std::string_view checkpoint_id) {
  const absl::StatusOr<std::string> dir = Resolve(checkpoint_id);
  std::shared_ptr<const format::Metadata> layout;
  {
    absl::MutexLock l(&mu_);
    std::shared_ptr<Global> g = FindLocked(checkpoint_id, dir);
    if (!g) return absl::NotFoundError(Unknown("GetLayout", checkpoint_id));
    if (!g->external) return NotExternal("GetLayout", *g);
    if (g->layout == nullptr || IsFinal(g->state) || g->committing) {
      return NotAwaiting("GetLayout", *g);
    }
    layout = g->layout;
  }
  std::vector<LayoutEntry> out;
  out.reserve(layout->storage_data.size());
  for (const auto& [key, info] : layout->storage_data)
    out.push_back({key, info});
  return out;
}

absl::Status Coordinator::Impl::CommitMetadata(std::string_view checkpoint_id,
                                               std::string bytes) {
  const absl::StatusOr<std::string> dir = Resolve(checkpoint_id);
  absl::MutexLock l(&mu_);
  std::shared_ptr<Global> g = FindLocked(checkpoint_id, dir);
  if (!g) return absl::NotFoundError(Unknown("CommitMetadata", checkpoint_id));
  if (!g->external) return NotExternal("CommitMetadata", *g);
  if (g->awaiting_since == absl::InfinitePast() || IsFinal(g->state) ||
      g->committing) {
    return NotAwaiting("CommitMetadata", *g);
  }
  spdlog::info(
      "coordinator: checkpoint {}: .metadata of {} bytes handed over after {}",
      g->dir, bytes.size(),
      absl::FormatDuration(options_.clock->Now() - g->awaiting_since));
  g->committing = true;  // step 4 begins: aborts are refused
  g->awaiting_since = absl::InfinitePast();
  pool_->Submit([this, g, bytes = std::move(bytes)]() mutable {
    RunExternalCommit(std::move(g), std::move(bytes));
  });
  return absl::OkStatus();
}

void Coordinator::Impl::RunDurable(std::shared_ptr<Global> g) {
  CKPTD_FAILPOINT("coordinator.all_prepared", g->dir);
  CommitInputs in;
  {
    absl::MutexLock l(&mu_);
    if (IsFinal(g->state)) return;
    in = TakeCommitInputsLocked(*g);
  }
  auto md = std::make_shared<const format::Metadata>(BuildMetadata(in));
  absl::Status s = PreparesGood(*g);
  if (s.ok()) s = CheckFiles(in.dir, in.io_dir, *md);
  Deferred d;
  absl::MutexLock l(&mu_);
  if (IsFinal(g->state)) return;
  if (!s.ok()) {
    FailLocked(*g, s, State::kFailed, d);
    return;
  }
  g->layout = std::move(md);
  g->awaiting_since = options_.clock->Now();
  spdlog::info(
      "coordinator: checkpoint {}: every node's data is durable ({} items on "
      "{} nodes); awaiting DCP's .metadata (metadata_timeout {})",
      g->dir, g->layout->storage_data.size(), g->num_nodes,
      absl::FormatDuration(g->metadata_timeout));
  if (g->durable_waiter) {
    d.Add([done = std::move(g->durable_waiter)]() mutable {
      std::move(done)(absl::OkStatus());
    });
    g->durable_waiter = nullptr;
  }
}

void Coordinator::Impl::RunExternalCommit(std::shared_ptr<Global> g,
                                          std::string bytes) {
  const absl::Time start = options_.clock->Now();
  // `committing` is set: the layout, plan and descs no longer change.
  CommitInputs in;
  std::shared_ptr<const format::Metadata> layout_md;
  {
    absl::MutexLock l(&mu_);
    in.dir = g->dir;
    in.io_dir = g->io_dir.empty() ? g->dir : g->io_dir;
    in.plan = g->plan;
    in.descs = g->descs;
    layout_md = g->layout;
  }
  absl::StatusOr<format::Metadata> md = DecodeExternalMetadata(bytes);
  absl::Status s = md.status();
  if (s.ok()) {
    // layout_md's storage_data is in plan order (BuildMetadata).
    std::vector<LayoutEntry> layout;
    std::vector<const format::ItemDesc*> items;
    layout.reserve(in.plan->items.size());
    items.reserve(in.plan->items.size());
    for (const auto& [key, info] : layout_md->storage_data)
      layout.push_back({key, info});
    for (const format::PlannedItem& pi : in.plan->items)
      items.push_back(&(*in.descs)[pi.rank][pi.item_index]);
    s = CheckExternalMetadata(*md, items, layout);
  }
  if (s.ok()) s = Publish(in, *md, bytes, *g);
  if (s.ok()) CKPTD_FAILPOINT("coordinator.after_rename", in.dir);
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    CommitDoneLocked(*g, s, md.ok() ? md->storage_data.size() : 0, start, d);
  }
  if (s.ok() && options_.on_commit)
    options_.on_commit(g->job, g->dir, g->created, g->keep_last_n,
                       g->keep_every);
}

}  // namespace ckptd::daemon
