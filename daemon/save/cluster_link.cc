// Copyright 2026 The ckptd Authors.
//
// The orchestrator, part 4: the node side of multi-node checkpoints. The
// participant (cluster/participant.h) says what to send and how to decide;
// this file makes the CoordinatorLink calls and applies their outcomes to
// the checkpoint (cluster/cluster.h draws the rounds).
//
//   all local ranks indexed → RunNodePlan: steps 0–1 (journal with the
//     node's ranks, the shared directory; the coordinator deals with a
//     stale .metadata) → Plan call → ApplyNodePlan → writers (step 2)
//   every local rank written → RunNodePrepare: step 3 → Prepare call →
//     answered OK: NodeCommitted (step 7), else the abort
//   every tick: HeartbeatLocked (progress, unreachable coordinator, the
//     in-doubt decision from .metadata: ResolveInDoubt)
#include <utility>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/plan/node_planner.h"
#include "daemon/save/checkpoint_manager_impl.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

absl::Status CheckpointManager::Impl::JoinClusterLocked(
    Checkpoint& c, const SaveBatch& batch) {
  ASSIGN_OR_RETURN(LocalRanks local,
                   ValidateCluster(batch.cluster, batch.world_size));
  c.local = std::move(local.ranks);
  c.num_local = static_cast<int>(c.local.size());
  if (!local.multi) return absl::OkStatus();
  c.multi = true;
  c.cluster = batch.cluster;
  c.is_coordinator = c.local.front() == 0;
  if (!options_.link_factory) {
    return absl::FailedPreconditionError(
        "this daemon has no peer service (peer_listen / peer_token_file are "
        "not set), so it "
        "cannot take part in a multi-node checkpoint");
  }
  ParticipantState p;
  if (c.is_coordinator) {
    // Non-owning: the coordinator lives as long as the manager.
    p.link = std::shared_ptr<CoordinatorLink>(std::shared_ptr<void>(),
                                              coordinator_.get());
    p.coordinator = "(this node)";
  } else {
    if (batch.cluster.coordinator.empty()) {
      return absl::InvalidArgumentError(
          "cluster.coordinator is empty: the peer address of rank 0's daemon "
          "is needed");
    }
    ASSIGN_OR_RETURN(p.link, options_.link_factory(batch.cluster.coordinator));
    p.coordinator = batch.cluster.coordinator;
  }
  p.id.checkpoint_id = batch.checkpoint_id;
  p.id.job = batch.job;
  p.id.node = c.local.front();
  p.id.attempt = absl::Uniform<uint64_t>(attempt_ids_);
  p.id.node_name = options_.node_name;
  c.node = std::move(p);
  return absl::OkStatus();
}

NodeProgress CheckpointManager::Impl::ProgressLocked(
    const Checkpoint& c) const {
  NodeProgress p;
  p.state = c.state;
  p.ranks_staged = c.ranks_staged;
  p.total_bytes = c.total_bytes;
  p.staged_bytes = c.staged_bytes;
  p.written_bytes = std::max(c.written_bytes, c.written_live.load());
  return p;
}

// ---------------------------------------------------------------------------
// Plan round
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::RunNodePlan(std::shared_ptr<Checkpoint> c) {
  NodeIndex index;
  CommitRecord record;
  PlanCallSpec spec;
  {
    absl::MutexLock l(&mu_);
    if (IsFinal(c->state)) {
      Deferred d;
      TaskEndLocked(c, d);
      return;
    }
    index = MakeNodeIndex(c->local, c->LocalIndexes());
    // The journal entry names the node's ranks: recovery removes only
    // their files.
    record = {c->dir,   c->job, c->uid,
              c->local, false,  absl::ToUnixMillis(c->created)};
    spec = {c->world_size,  c->cluster.num_nodes, c->overwrite, c->dedup_lowest,
            c->keep_last_n, c->created,           c->keep_every};
  }
  // 0–1, without the stale-marker check: the coordinator deals with it
  // before answering the plan.
  PreparedAttempt attempt =
      PrepareAttempt(record, /*check_marker=*/false, c->overwrite, nullptr);
  PlanCall call = MakePlanCall(c->node->id, spec, index);
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    RecordAttemptLocked(*c, attempt);
    if (!attempt.status.ok() || IsFinal(c->state)) {
      if (!attempt.status.ok())
        FailLocked(c, attempt.status, State::kFailed, d);
      TaskEndLocked(c, d);
      return;
    }
    const std::string key = c->job + "\n" + c->cluster.coordinator;
    auto it = sent_digest_.find(key);
    if (it == sent_digest_.end() || it->second != call.index_digest) {
      call.index = std::make_shared<NodeIndex>(std::move(index));
    }
    c->node->plan_sent = true;
    c->node->last_contact = c->node->last_heartbeat = clock_->Now();
  }
  // The task goes on in the link's callback (busy_tasks stays held).
  if (call.index) {
    SendPlan(c, std::move(call));
    return;
  }
  // Digest only; resent with the index if the coordinator lost it.
  PlanCall again = call;
  again.index = std::make_shared<NodeIndex>(std::move(index));
  c->node->link->Plan(
      std::move(call), [this, c, again = std::move(again)](
                           absl::StatusOr<NodePlan> plan) mutable {
        LinkCallback scope(this);
        if (!plan.ok() && absl::IsFailedPrecondition(plan.status()) &&
            plan.status().message() == kIndexNotCached) {
          spdlog::info(
              "checkpoint {}: the coordinator has no cached index; sending it",
              c->dir);
          SendPlan(c, std::move(again));
          return;
        }
        ApplyNodePlan(c, std::move(plan));
      });
}

void CheckpointManager::Impl::SendPlan(std::shared_ptr<Checkpoint> c,
                                       PlanCall call) {
  const uint64_t digest = call.index_digest;
  const std::string key = c->job + "\n" + c->cluster.coordinator;
  c->node->link->Plan(
      std::move(call),
      [this, c, digest, key](absl::StatusOr<NodePlan> plan) mutable {
        LinkCallback scope(this);
        if (plan.ok()) {
          absl::MutexLock l(&mu_);
          sent_digest_[key] = digest;
        }
        ApplyNodePlan(c, std::move(plan));
      });
}

void CheckpointManager::Impl::ApplyNodePlan(
    const std::shared_ptr<Checkpoint>& c, absl::StatusOr<NodePlan> plan) {
  Deferred d;
  absl::MutexLock l(&mu_);
  if (IsFinal(c->state)) {
    TaskEndLocked(c, d);
    return;
  }
  absl::StatusOr<WritePlan> wp =
      plan.ok() ? PlanFromCoordinator(*plan, c->local, c->LocalIndexes(),
                                      c->world_size)
                : absl::StatusOr<WritePlan>(plan.status());
  if (!plan.ok()) {
    const absl::Status& s = plan.status();
    FailLocked(
        c,
        absl::Status(s.code(), fmt::format("plan round with coordinator {}: {}",
                                           c->node->coordinator, s.message())),
        State::kFailed, d);
  } else if (!wp.ok()) {
    FailLocked(c, wp.status(), State::kFailed, d);
  } else {
    c->node->last_contact = clock_->Now();
    ApplyPlanLocked(c, *std::move(wp));
  }
  TaskEndLocked(c, d);
}

// ---------------------------------------------------------------------------
// Commit round
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::RunNodePrepare(std::shared_ptr<Checkpoint> c) {
  // Step 2 was done by the writers. 3. The data files' directory entries.
  absl::Status s =
      format::SyncDataFileEntries({env_, options_.fsync}, c->io_dir);
  PrepareCall call;
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    if (!s.ok() || IsFinal(c->state)) {
      if (!s.ok()) FailLocked(c, s, State::kFailed, d);
      TaskEndLocked(c, d);
      return;
    }
    NodeProgress progress = ProgressLocked(*c);
    progress.state = State::kCommitting;
    progress.written_bytes = c->written_bytes;
    call = MakePrepareCall(c->node->id, c->local, c->plan, c->infos, progress);
    c->node->prepare_sent = true;
    c->node->prepare_sent_at = clock_->Now();
    spdlog::info(
        "checkpoint {}: this node's files are durable; prepared, waiting for "
        "the "
        "coordinator's decision",
        c->dir);
  }
  c->node->link->Prepare(std::move(call),
                         [this, c](absl::StatusOr<GlobalStatus> g) mutable {
                           LinkCallback scope(this);
                           PrepareAnswered(c, std::move(g));
                         });
}

void CheckpointManager::Impl::PrepareAnswered(
    const std::shared_ptr<Checkpoint>& c, absl::StatusOr<GlobalStatus> g) {
  if (g.ok()) {
    {
      absl::MutexLock l(&mu_);
      c->node->global = *g;
    }
    NodeCommitted(c);
    return;
  }
  const absl::Status s = g.status();
  Deferred d;
  absl::MutexLock l(&mu_);
  if (stopping_ && !IsFinal(c->state)) {
    // Shutting down while prepared: the decision may still be commit. Keep
    // the files and the journal entry; recovery at the next start keeps
    // them if .metadata appeared, else removes them.
    c->cleaned = true;
    FailLocked(c,
               absl::UnavailableError(
                   "the daemon shut down while waiting for the coordinator's "
                   "decision; the next start settles the files"),
               State::kFailed, d);
  }
  if (!IsFinal(c->state)) {
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
        absl::IsUnknown(s) || absl::IsInternal(s)) {
      // The link failed, not (necessarily) the checkpoint: the coordinator
      // may still commit. The heartbeat loop learns the decision, or decides
      // from .metadata once the coordinator can no longer commit.
      c->node->last_peer_error = s;
      spdlog::warn(
          "checkpoint {}: no answer to prepare ({}); waiting for the decision",
          c->dir, s);
    } else {
      FailLocked(c, s,
                 absl::IsCancelled(s) ? State::kCancelled : State::kFailed, d);
    }
  }
  TaskEndLocked(c, d);
}

void CheckpointManager::Impl::NodeCommitted(
    const std::shared_ptr<Checkpoint>& c) {
  bool committed = false;
  int64_t uid = kUnknownUid;
  HoldInMemory(c);
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    if (!IsFinal(c->state)) {
      GlobalStatus& g = c->node->global;
      g.state = State::kCommitted;
      g.nodes_prepared = g.nodes_planned = c->cluster.num_nodes;
      spdlog::info(
          "checkpoint {} committed by coordinator {}: this node wrote {} bytes "
          "in {} "
          "files, {} after its first request",
          c->dir, c->node->coordinator, c->written_bytes,
          c->plan.plan.files.size(),
          absl::FormatDuration(clock_->Now() - c->created));
      CommittedLocked(c, d);
      committed = true;
      uid = c->uid;
    }
    // A committed checkpoint's task ends after step 7 and the history (so
    // Shutdown waits for them: this runs on a gRPC thread, not the pool).
    if (!committed) TaskEndLocked(c, d);
  }
  if (committed) {
    // 7. (Retention of a multi-node checkpoint is its coordinator's.)
    SettleCommit({c->dir, c->job, uid, std::nullopt, false,
                  absl::ToUnixMillis(c->created)},
                 c->journal_path, {c->keep_last_n, c->keep_every},
                 /*retain=*/false);
    TaskEnd(c);
  } else {
    tier_.Drop(c->dir);
  }
}

void CheckpointManager::Impl::ResolveInDoubt(std::shared_ptr<Checkpoint> c,
                                             absl::Status error) {
  // No writer runs any more: the plan, indexes and infos are settled.
  const bool committed =
      NodeDataCommitted(env_, c->io_dir.empty() ? c->dir : c->io_dir, c->local,
                        c->LocalIndexes(), c->plan, c->infos);
  if (committed) {
    spdlog::warn(
        "checkpoint {}: the coordinator did not answer ({}), but .metadata "
        "lists this "
        "node's data: committed",
        c->dir, error);
    {
      absl::MutexLock l(&mu_);
      ++c->busy_tasks;  // NodeCommitted ends one task
    }
    NodeCommitted(c);
  } else {
    Deferred d;
    absl::MutexLock l(&mu_);
    if (!IsFinal(c->state)) {
      FailLocked(
          c,
          absl::Status(
              error.code(),
              fmt::format("no decision from coordinator {} and no .metadata "
                          "naming this node's data: {}",
                          c->node->coordinator, error.message())),
          State::kFailed, d);
    }
  }
  TaskEnd(c);
}

// ---------------------------------------------------------------------------
// Heartbeats and aborts
// ---------------------------------------------------------------------------

void CheckpointManager::Impl::HeartbeatLocked(
    const std::shared_ptr<Checkpoint>& c, absl::Time now, Deferred& d) {
  ParticipantState& p = *c->node;
  const ParticipantTimeouts timeouts{
      options_.peer_timeout, options_.peer_heartbeat, options_.commit_timeout};
  const std::string last_error =
      p.last_peer_error.ok()
          ? ""
          : fmt::format("; last error: {}", p.last_peer_error);
  switch (NextHeartbeatStep(p, now, timeouts)) {
    case HeartbeatStep::kNothing:
      return;
    case HeartbeatStep::kUnreachable:
      FailLocked(c,
                 absl::UnavailableError(fmt::format(
                     "coordinator {} was not reachable for {} (peer_timeout){}",
                     p.coordinator, absl::FormatDuration(now - p.last_contact),
                     last_error)),
                 State::kFailed, d);
      return;
    case HeartbeatStep::kResolve: {
      p.in_doubt = true;
      absl::Status error = absl::UnavailableError(
          fmt::format("no decision from coordinator {} within commit_timeout + "
                      "peer_timeout of "
                      "this node's prepare{}",
                      p.coordinator, last_error));
      SubmitLocked(c, [this, c, error]() mutable {
        ResolveInDoubt(std::move(c), error);
      });
      return;
    }
    case HeartbeatStep::kSend:
      break;
  }
  p.heartbeat_in_flight = true;
  p.last_heartbeat = now;
  ++c->busy_tasks;
  d.Add([this, c, link = p.link, id = p.id,
         progress = ProgressLocked(*c)]() mutable {
    link->Heartbeat(id, progress, [this, c](absl::StatusOr<GlobalStatus> g) {
      LinkCallback scope(this);
      HeartbeatAnswered(c, std::move(g));
    });
  });
}

void CheckpointManager::Impl::HeartbeatAnswered(
    const std::shared_ptr<Checkpoint>& c, absl::StatusOr<GlobalStatus> g) {
  Deferred d;
  absl::MutexLock l(&mu_);
  ParticipantState& p = *c->node;
  p.heartbeat_in_flight = false;
  if (g.ok()) {
    p.last_contact = clock_->Now();
    p.last_peer_error = absl::OkStatus();
    p.global = *g;
    if ((g->state == State::kFailed || g->state == State::kCancelled) &&
        !IsFinal(c->state)) {
      FailLocked(c,
                 g->error.ok()
                     ? absl::AbortedError("aborted by the coordinator")
                     : g->error,
                 g->state, d);
    } else if (g->state == State::kCommitted && p.prepare_sent &&
               !IsFinal(c->state) && !p.in_doubt) {
      // The answer to our prepare was lost; the decision was commit.
      p.in_doubt = true;
      ++c->busy_tasks;  // NodeCommitted ends one
      d.Add([this, c] { NodeCommitted(c); });
    }
  } else {
    p.last_peer_error = g.status();
    if (absl::IsNotFound(g.status()) && p.prepare_sent && !IsFinal(c->state) &&
        !p.in_doubt) {
      // The coordinator forgot the checkpoint (it restarted): it will not
      // commit it now; .metadata decides.
      p.in_doubt = true;
      SubmitLocked(c, [this, c, s = g.status()]() mutable {
        ResolveInDoubt(std::move(c), s);
      });
    }
  }
  TaskEndLocked(c, d);
}

void CheckpointManager::Impl::AbortAtCoordinatorLocked(
    const std::shared_ptr<Checkpoint>& c, absl::Status reason, Deferred& d) {
  ++c->busy_tasks;
  d.Add([this, c, link = c->node->link, id = c->node->id, reason]() {
    link->Abort(id, reason,
                [this, c, cancel = absl::IsCancelled(reason)](absl::Status s) {
                  LinkCallback scope(this);
                  if (!s.ok() && cancel) {
                    spdlog::warn(
                        "checkpoint {}: the coordinator refused the cancel: {}",
                        c->dir, s);
                  }
                  TaskEnd(c);
                });
  });
}

}  // namespace ckptd::daemon
