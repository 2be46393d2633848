// Copyright 2026 The ckptd Authors.
//
// The coordinator of multi-node checkpoints, part 2: the tasks of the two
// rounds (coordinator.h draws the protocol, docs/durability.md numbers the
// steps):
//
//   RunPlan     every node's index in → PlanSave over all ranks (or the
//               plan cache), step 1 (the directory, no stale marker), each
//               node answered its part of the plan
//   RunCommit   every node prepared → .metadata from the plan and the
//               nodes' storage, checked against the files, published with
//               steps 4–6; the nodes' Prepare calls answered
#include <algorithm>
#include <utility>

#include "common/absl_fmt.h"
#include "common/failpoint.h"
#include "common/status_macros.h"
#include "daemon/cluster/coordinator_impl.h"
#include "fmt/format.h"
#include "format/plan/commit_protocol.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

// ---------------------------------------------------------------------------
// Plan round
// ---------------------------------------------------------------------------

absl::StatusOr<Coordinator::Impl::PlanInputs>
Coordinator::Impl::TakePlanInputsLocked(Global& g) {
  NodeDigests digests;
  for (const auto& [id, n] : g.nodes) digests[id] = {n.digest, n.ranks};
  PlanInputs in;
  if (const PlanCache::Entry* e = cache_.Match(
          g.job, g.world_size, g.dedup, digests, options_.clock->Now())) {
    in.descs = e->descs;
    in.plan = e->plan;
    for (auto& [id, n] : g.nodes) n.index.reset();
    return in;
  }
  const PlanCache::Entry* cached = cache_.Find(g.job);
  auto built = std::make_shared<Descs>(g.world_size);
  for (auto& [id, n] : g.nodes) {
    if (!n.index) {
      // Digest only: the cache had it when the node called; another
      // checkpoint of the job may have replaced it since.
      auto cn = cached ? cached->nodes.find(id) : NodeDigests::const_iterator();
      if (cached == nullptr || cn == cached->nodes.end() ||
          cn->second.first != n.digest) {
        return absl::AbortedError(
            fmt::format("the plan cache of job '{}' changed while node {} "
                        "relied on it; save "
                        "again",
                        g.job, id));
      }
    }
    // An if, not `n.index ? std::move(...) : (*cached->descs)[...]`: with
    // the const operand the conditional is a const prvalue, and assigning
    // it copies every item (2 M ItemDescs, ~0.3 s at 1024 x 2000).
    for (size_t i = 0; i < n.ranks.size(); ++i) {
      if (n.index) {
        (*built)[n.ranks[i]] = std::move(n.index->items[i]);
      } else {
        (*built)[n.ranks[i]] = (*cached->descs)[n.ranks[i]];
      }
    }
    n.index.reset();
  }
  in.descs = std::move(built);
  return in;
}

absl::Status Coordinator::Impl::PrepareDirectory(Global& g) {
  // Step 1, before any node is told its plan: no node writes a data file
  // next to a stale commit marker.
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointDir> dirh,
                   CheckpointDir::Open(env_, options_.checkpoint_roots, g.dir,
                                       /*create=*/true));
  const std::string io_dir = dirh->io_path();
  {
    absl::MutexLock l(&mu_);
    g.io_dir = io_dir;
    g.dirh = std::move(dirh);
  }
  return format::PrepareCheckpointDir({env_, /*sync=*/true}, io_dir,
                                      g.overwrite, nullptr, g.dir);
}

void Coordinator::Impl::RunPlan(std::shared_ptr<Global> g) {
  CKPTD_FAILPOINT("coordinator.plan_round", g->dir);
  const absl::Time start = options_.clock->Now();
  // The nodes' entries no longer change until planned (state past
  // kPending); the inputs are taken under the lock.
  absl::StatusOr<PlanInputs> in;
  {
    Deferred d;  // before the lock: runs after it is released
    absl::MutexLock l(&mu_);
    if (IsFinal(g->state)) return;
    in = TakePlanInputsLocked(*g);
    if (!in.ok()) {
      FailLocked(*g, in.status(), State::kFailed, d);
      return;
    }
  }
  const bool cached = in->plan != nullptr;
  absl::Status s;
  if (!cached) {
    format::PlanOptions po;
    po.dedup_save_to_lowest_rank = g->dedup;
    po.max_items = options_.max_items * static_cast<uint64_t>(g->world_size);
    absl::StatusOr<format::SavePlan> p = format::PlanSave(*in->descs, po);
    if (p.ok()) {
      in->plan = std::make_shared<const format::SavePlan>(*std::move(p));
    } else {
      s = p.status();
    }
  }
  if (s.ok()) s = PrepareDirectory(*g);
  Deferred d;
  absl::MutexLock l(&mu_);
  if (IsFinal(g->state)) return;
  if (!s.ok()) {
    FailLocked(*g, s, State::kFailed, d);
    return;
  }
  PlanMadeLocked(*g, *in, cached, start, d);
}

void Coordinator::Impl::PlanMadeLocked(Global& g, const PlanInputs& in,
                                       bool cached, absl::Time start,
                                       Deferred& d) {
  // Each node's part: which of its items survive, and its files.
  std::map<int, NodePlan> parts;
  // Each global rank's part, looked up once per plan item (2 M of them at
  // 1,024 ranks: by index, not through the map).
  std::vector<NodePlan::Rank*> part_of(g.world_size, nullptr);
  for (const auto& [id, n] : g.nodes) {
    NodePlan& np = parts[id];
    np.cached = cached;
    np.ranks.reserve(n.ranks.size());
    for (size_t i = 0; i < n.ranks.size(); ++i) {
      np.ranks.push_back(
          {n.ranks[i], std::vector<bool>((*in.descs)[n.ranks[i]].size()), ""});
      part_of[n.ranks[i]] = &np.ranks.back();
    }
  }
  g.kept.assign(g.world_size, 0);
  for (const format::PlannedItem& pi : in.plan->items) {
    part_of[pi.rank]->keep[pi.item_index] = true;
    ++g.kept[pi.rank];
  }
  for (const format::PlannedFile& f : in.plan->files) {
    part_of[f.rank]->file = f.relative_path;
  }
  g.descs = in.descs;
  g.plan = in.plan;
  g.state = State::kWriting;
  g.nodes_planned = g.num_nodes;
  const absl::Time now = options_.clock->Now();
  if (!cached) {
    PlanCache::Entry e{g.world_size, g.dedup, {}, in.descs, in.plan, now};
    for (const auto& [id, n] : g.nodes) e.nodes[id] = {n.digest, n.ranks};
    cache_.Insert(g.job, std::move(e));
  }
  spdlog::info(
      "coordinator: checkpoint {}: {} items of {} ranks planned into {} "
      "files{} in {}",
      g.dir, in.plan->items.size(), g.world_size, in.plan->files.size(),
      cached ? " (plan cache)" : "", absl::FormatDuration(now - start));
  for (auto& [id, n] : g.nodes) {
    n.planned = true;
    n.last_contact = now;
    if (n.plan_waiter) {
      d.Add([done = std::move(n.plan_waiter),
             part = std::move(parts[id])]() mutable {
        std::move(done)(std::move(part));
      });
      n.plan_waiter = nullptr;
    }
  }
}

// ---------------------------------------------------------------------------
// Commit round
// ---------------------------------------------------------------------------

absl::Status Coordinator::Impl::CheckFiles(const std::string& dir,
                                           const std::string& io_dir,
                                           const format::Metadata& md) {
  absl::flat_hash_map<std::string, uint64_t> need;
  for (const auto& [key, info] : md.storage_data) {
    uint64_t& n = need[info.relative_path];
    n = std::max(n, info.offset + info.length);
  }
  for (const auto& [file, bytes] : need) {
    absl::StatusOr<uint64_t> size = env_->GetFileSize(JoinPath(io_dir, file));
    if (!size.ok() || *size < bytes) {
      return absl::FailedPreconditionError(fmt::format(
          "data file {} of checkpoint {} is {} to the coordinator (needs {} "
          "bytes): checkpoint "
          "storage must be shared by all nodes, and no node may have given up",
          file, dir,
          size.ok() ? fmt::format("{} bytes", *size)
                    : fmt::format("{}", size.status()),
          bytes));
    }
  }
  return absl::OkStatus();
}

Coordinator::Impl::CommitInputs Coordinator::Impl::TakeCommitInputsLocked(
    Global& g) {
  CommitInputs in;
  in.dir = g.dir;
  in.io_dir = g.io_dir.empty() ? g.dir : g.io_dir;
  in.plan = g.plan;
  in.descs = g.descs;
  in.storage.resize(g.world_size);
  for (auto& [id, n] : g.nodes) {
    for (PrepareCall::Rank& r : n.storage) in.storage[r.rank] = std::move(r);
    n.storage.clear();
  }
  return in;
}

// The global .metadata: the plan's skeleton, storage_data in plan order
// (rank order, each rank's items in index order, as the nodes wrote them)
// from the nodes' prepares.
format::Metadata Coordinator::Impl::BuildMetadata(const CommitInputs& in) {
  format::Metadata md;
  md.state_dict_metadata = in.plan->metadata.state_dict_metadata;
  md.planner_data = in.plan->metadata.planner_data;
  md.version = in.plan->metadata.version;
  absl::flat_hash_map<int, const std::string*> file_of;
  for (const format::PlannedFile& f : in.plan->files)
    file_of[f.rank] = &f.relative_path;
  std::vector<size_t> cursor(in.storage.size(), 0);
  md.storage_data.reserve(in.plan->items.size());
  for (const format::PlannedItem& pi : in.plan->items) {
    const PrepareCall::Rank& r = in.storage[pi.rank];
    const size_t k = cursor[pi.rank]++;
    md.storage_data.emplace_back(
        (*in.descs)[pi.rank][pi.item_index].Key(),
        format::StorageInfo{*file_of[pi.rank], r.offset[k], r.length[k],
                            r.transforms.empty() ? std::vector<std::string>{}
                                                 : r.transforms[k]});
  }
  format::StorageMeta sm;
  sm.checkpoint_id = in.dir;
  md.storage_meta = sm;
  return md;
}

absl::Status Coordinator::Impl::PreparesGood(const Global& g) {
  // A node that lost the coordinator waits commit_timeout + peer_timeout
  // after its prepare before it decides from .metadata; the coordinator
  // never renames .metadata in after commit_timeout of any prepare.
  absl::MutexLock l(&mu_);
  const absl::Time now = options_.clock->Now();
  const absl::Duration window = CommitWindow(g);
  for (const auto& [id, n] : g.nodes) {
    if (now - n.prepared_at > window) {
      return absl::DeadlineExceededError(fmt::format(
          "node {} ({}) prepared {} ago, more than commit_timeout {}{}", id,
          n.name, absl::FormatDuration(now - n.prepared_at),
          absl::FormatDuration(options_.commit_timeout),
          g.external ? fmt::format(" + metadata_timeout {}",
                                   absl::FormatDuration(g.metadata_timeout))
                     : std::string()));
    }
  }
  return absl::OkStatus();
}

absl::Duration Coordinator::Impl::CommitWindow(const Global& g) const {
  return options_.commit_timeout +
         (g.external ? g.metadata_timeout : absl::ZeroDuration());
}

absl::Status Coordinator::Impl::Publish(const CommitInputs& in,
                                        const format::Metadata& md,
                                        std::string_view bytes,
                                        const Global& g) {
  const format::CommitProtocolOptions protocol{env_, options_.fsync};
  // Validation: every node's prepare still good, every file visible.
  RETURN_IF_ERROR(PreparesGood(g));
  RETURN_IF_ERROR(CheckFiles(in.dir, in.io_dir, md));
  // 4–6 (format/plan/commit_protocol.h), the deadline checked again before 5.
  RETURN_IF_ERROR(format::PublishMetadata(protocol, in.io_dir, bytes, [&] {
                    absl::Status good = PreparesGood(g);
                    CKPTD_FAILPOINT("coordinator.before_rename", in.dir);
                    return good;
                  }).status());
  // Nobody took a file away meanwhile; else un-published.
  absl::Status again = CheckFiles(in.dir, in.io_dir, md);
  if (again.ok()) return again;
  if (absl::Status u = format::UnpublishMetadata(protocol, in.io_dir);
      !u.ok()) {
    return absl::Status(
        again.code(), fmt::format("{}; un-publishing .metadata failed too: {}",
                                  again.message(), u.message()));
  }
  return again;
}

void Coordinator::Impl::RunCommit(std::shared_ptr<Global> g) {
  CKPTD_FAILPOINT("coordinator.all_prepared", g->dir);
  const absl::Time start = options_.clock->Now();
  // Every node prepared and `committing` is set. The inputs are taken under
  // the lock (the plan and descs are immutable; the nodes' storage is moved
  // out), then the metadata is built without it (2 M items take a second;
  // other checkpoints' calls go on meanwhile).
  CommitInputs in;
  {
    absl::MutexLock l(&mu_);
    in = TakeCommitInputsLocked(*g);
  }
  const format::Metadata md = BuildMetadata(in);
  absl::StatusOr<std::string> bytes =
      format::EncodeMetadata(md, format::EncodeOptions{});
  const absl::Status s =
      bytes.ok() ? Publish(in, md, *bytes, *g) : bytes.status();
  if (s.ok()) CKPTD_FAILPOINT("coordinator.after_rename", in.dir);
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    CommitDoneLocked(*g, s, md.storage_data.size(), start, d);
  }
  if (s.ok() && options_.on_commit)
    options_.on_commit(g->job, g->dir, g->created, g->keep_last_n,
                       g->keep_every);
}

void Coordinator::Impl::CommitDoneLocked(Global& g, const absl::Status& s,
                                         size_t items, absl::Time start,
                                         Deferred& d) {
  g.committing = false;
  if (!s.ok()) {
    FailLocked(g, s, State::kFailed, d);
    return;
  }
  g.state = State::kCommitted;
  g.finished = options_.clock->Now();
  g.layout.reset();
  spdlog::info(
      "coordinator: checkpoint {} committed: {} nodes, {} items, .metadata in "
      "{} ({} after the "
      "first index)",
      g.dir, g.num_nodes, items, absl::FormatDuration(g.finished - start),
      absl::FormatDuration(g.finished - g.created));
  const GlobalStatus final_status = StatusOfLocked(g);
  for (auto& [id, n] : g.nodes) {
    if (n.prepare_waiter) {
      d.Add([done = std::move(n.prepare_waiter), final_status]() mutable {
        std::move(done)(final_status);
      });
      n.prepare_waiter = nullptr;
    }
  }
}

}  // namespace ckptd::daemon
