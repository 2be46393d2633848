// Copyright 2026 The ckptd Authors.
//
// The node side of a multi-node checkpoint: joining the cluster, the plan
// round, the commit round (prepare, the decision, the in-doubt resolution
// from .metadata), heartbeats and aborts (cluster_link.h draws the rounds).
#include "daemon/save/cluster_link.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/absl_fmt.h"
#include "common/failpoint.h"
#include "common/status_macros.h"
#include "daemon/cluster/participant.h"
#include "daemon/plan/node_planner.h"
#include "daemon/save/external_commit.h"
#include "daemon/save/tasks.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon::save::cluster_link {
namespace {

// Held by a coordinator-link callback (on a gRPC thread) for its whole
// body, the work it defers past the lock included. Its task's end
// (busy_tasks) comes before that deferred work runs, so Shutdown also
// waits until no callback holds one: the body may use the core to its
// last statement.
class LinkCallback {
 public:
  explicit LinkCallback(SaveCore& core) ABSL_LOCKS_EXCLUDED(core.mu)
      : core_(core) {
    absl::MutexLock l(&core_.mu);
    ++core_.link_callbacks;
  }
  ~LinkCallback() {
    absl::MutexLock l(&core_.mu);
    --core_.link_callbacks;
  }
  LinkCallback(const LinkCallback&) = delete;
  LinkCallback& operator=(const LinkCallback&) = delete;

 private:
  SaveCore& core_;
};

// external_metadata on the coordinator's node: every node is durable, DCP's
// .metadata is awaited here (until_data_durable waiters answered); an
// error is the abort, which the answer to the Prepare carries too.
void DurableAnswered(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     const absl::Status& s) {
  Deferred d;
  absl::MutexLock l(&core.mu);
  if (s.ok() && !IsFinal(c->state)) {
    spdlog::info(
        "checkpoint {}: every node's data is durable; awaiting DCP's "
        ".metadata",
        c->dir);
    external_commit::DataDurableLocked(core, c, d);
  }
  attempt::TaskEndLocked(core, c, d);
}

}  // namespace

absl::Status JoinClusterLocked(SaveCore& core, Checkpoint& c,
                               const SaveBatch& batch) {
  ASSIGN_OR_RETURN(LocalRanks local,
                   ValidateCluster(batch.cluster, batch.world_size));
  c.local = std::move(local.ranks);
  c.num_local = static_cast<int>(c.local.size());
  if (!local.multi) return absl::OkStatus();
  c.multi = true;
  c.cluster = batch.cluster;
  c.is_coordinator = c.local.front() == 0;
  if (!core.options.link_factory) {
    return absl::FailedPreconditionError(
        "this daemon has no peer service (peer_listen / peer_token_file are "
        "not set), so it "
        "cannot take part in a multi-node checkpoint");
  }
  ParticipantState p;
  if (c.is_coordinator) {
    // Non-owning: the coordinator lives as long as the manager.
    p.link = std::shared_ptr<CoordinatorLink>(std::shared_ptr<void>(),
                                              core.coordinator.get());
    p.coordinator = "(this node)";
  } else {
    if (batch.cluster.coordinator.empty()) {
      return absl::InvalidArgumentError(
          "cluster.coordinator is empty: the peer address of rank 0's daemon "
          "is needed");
    }
    ASSIGN_OR_RETURN(p.link,
                     core.options.link_factory(batch.cluster.coordinator));
    p.coordinator = batch.cluster.coordinator;
  }
  p.id.checkpoint_id = batch.checkpoint_id;
  p.id.job = batch.job;
  p.id.node = c.local.front();
  p.id.attempt = absl::Uniform<uint64_t>(core.attempt_ids);
  p.id.node_name = core.options.node_name;
  c.node = std::move(p);
  return absl::OkStatus();
}

NodeProgress ProgressLocked(const SaveCore& core, const Checkpoint& c) {
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

void RunNodePlan(SaveCore& core, std::shared_ptr<Checkpoint> c) {
  NodeIndex index;
  CommitRecord record;
  PlanCallSpec spec;
  {
    absl::MutexLock l(&core.mu);
    if (IsFinal(c->state)) {
      Deferred d;
      attempt::TaskEndLocked(core, c, d);
      return;
    }
    index = MakeNodeIndex(c->local, c->LocalIndexes());
    // The journal entry names the node's ranks: recovery removes only
    // their files.
    record = {c->dir,   c->job, c->uid,
              c->local, false,  absl::ToUnixMillis(c->created)};
    // How long after this node's prepare the coordinator may still commit
    // (the heartbeat's in-doubt rule, participant.cc): a restart's
    // recovery waits as long before it decides.
    record.settle_ms = absl::ToInt64Milliseconds(
        core.options.commit_timeout + core.options.peer_timeout +
        (c->external_metadata ? c->metadata_timeout : absl::ZeroDuration()));
    spec = {c->world_size,   c->cluster.num_nodes, c->overwrite,
            c->dedup_lowest, c->keep_last_n,       c->created,
            c->keep_every,   c->external_metadata, c->metadata_timeout,
            c->zstd_level};
  }
  // 0–1, without the stale-marker check: the coordinator deals with it
  // before answering the plan.
  tasks::PreparedAttempt attempt = tasks::PrepareAttempt(
      core, record, /*check_marker=*/false, c->overwrite, nullptr);
  PlanCall call = MakePlanCall(c->node->id, spec, index);
  call.failure_domain = core.options.failure_domain;
  {
    Deferred d;
    absl::MutexLock l(&core.mu);
    tasks::RecordAttemptLocked(core, *c, attempt);
    if (!attempt.status.ok() || IsFinal(c->state)) {
      if (!attempt.status.ok())
        attempt::FailLocked(core, c, attempt.status, State::kFailed, d);
      attempt::TaskEndLocked(core, c, d);
      return;
    }
    const std::string key = c->job + "\n" + c->cluster.coordinator;
    auto it = core.sent_digest.find(key);
    if (it == core.sent_digest.end() || it->second != call.index_digest) {
      call.index = std::make_shared<NodeIndex>(std::move(index));
    }
    c->node->plan_sent = true;
    c->node->last_contact = c->node->last_heartbeat = core.clock->Now();
  }
  CKPTD_FAILPOINT("node.before_plan", c->dir);
  // The task goes on in the link's callback (busy_tasks stays held).
  if (call.index) {
    SendPlan(core, c, std::move(call));
    return;
  }
  // Digest only; resent with the index if the coordinator lost it.
  PlanCall again = call;
  again.index = std::make_shared<NodeIndex>(std::move(index));
  c->node->link->Plan(
      std::move(call), [&core, c, again = std::move(again)](
                           absl::StatusOr<NodePlan> plan) mutable {
        LinkCallback scope(core);
        if (!plan.ok() && absl::IsFailedPrecondition(plan.status()) &&
            plan.status().message() == kIndexNotCached) {
          spdlog::info(
              "checkpoint {}: the coordinator has no cached index; sending it",
              c->dir);
          SendPlan(core, c, std::move(again));
          return;
        }
        ApplyNodePlan(core, c, std::move(plan));
      });
}

void SendPlan(SaveCore& core, std::shared_ptr<Checkpoint> c, PlanCall call) {
  const uint64_t digest = call.index_digest;
  const std::string key = c->job + "\n" + c->cluster.coordinator;
  c->node->link->Plan(
      std::move(call),
      [&core, c, digest, key](absl::StatusOr<NodePlan> plan) mutable {
        LinkCallback scope(core);
        if (plan.ok()) {
          absl::MutexLock l(&core.mu);
          core.sent_digest[key] = digest;
        }
        ApplyNodePlan(core, c, std::move(plan));
      });
}

void ApplyNodePlan(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                   absl::StatusOr<NodePlan> plan) {
  CKPTD_FAILPOINT("node.plan_arrived", c->dir);
  Deferred d;
  absl::MutexLock l(&core.mu);
  if (IsFinal(c->state)) {
    attempt::TaskEndLocked(core, c, d);
    return;
  }
  absl::StatusOr<WritePlan> wp =
      plan.ok() ? PlanFromCoordinator(*plan, c->local, c->LocalIndexes(),
                                      c->world_size)
                : absl::StatusOr<WritePlan>(plan.status());
  if (!plan.ok()) {
    const absl::Status& s = plan.status();
    attempt::FailLocked(
        core, c,
        absl::Status(s.code(), fmt::format("plan round with coordinator {}: {}",
                                           c->node->coordinator, s.message())),
        State::kFailed, d);
  } else if (!wp.ok()) {
    attempt::FailLocked(core, c, wp.status(), State::kFailed, d);
  } else {
    c->node->last_contact = core.clock->Now();
    tasks::ApplyPlanLocked(core, c, *std::move(wp));
  }
  attempt::TaskEndLocked(core, c, d);
}

// ---------------------------------------------------------------------------
// Commit round
// ---------------------------------------------------------------------------

void RunNodePrepare(SaveCore& core, std::shared_ptr<Checkpoint> c) {
  CKPTD_FAILPOINT("node.before_prepare", c->dir);
  // Step 2 was done by the writers. 3. The data files' directory entries.
  absl::Status s =
      format::SyncDataFileEntries({core.env, core.options.fsync}, c->io_dir);
  PrepareCall call;
  // DCP's StorageWriter: the coordinator's node learns when every node is
  // durable (its ranks' finish waits for it; the Prepare is answered only
  // with the decision).
  bool await_durable = false;
  {
    Deferred d;
    absl::MutexLock l(&core.mu);
    if (!s.ok() || IsFinal(c->state)) {
      if (!s.ok()) attempt::FailLocked(core, c, s, State::kFailed, d);
      attempt::TaskEndLocked(core, c, d);
      return;
    }
    NodeProgress progress = ProgressLocked(core, *c);
    progress.state = State::kCommitting;
    progress.written_bytes = c->written_bytes;
    call = MakePrepareCall(c->node->id, c->local, c->plan, c->infos, progress);
    c->node->prepare_sent = true;
    c->node->prepare_sent_at = core.clock->Now();
    await_durable = c->external_metadata && c->is_coordinator &&
                    core.coordinator != nullptr;
    if (await_durable) ++c->busy_tasks;  // DurableAnswered ends it
    spdlog::info(
        "checkpoint {}: this node's files are durable; prepared, waiting for "
        "the "
        "coordinator's decision",
        c->dir);
  }
  if (await_durable) {
    core.coordinator->AwaitDataDurable(c->node->id, [&core, c](absl::Status s) {
      LinkCallback scope(core);
      DurableAnswered(core, c, s);
    });
  }
  c->node->link->Prepare(std::move(call),
                         [&core, c](absl::StatusOr<GlobalStatus> g) mutable {
                           LinkCallback scope(core);
                           PrepareAnswered(core, c, std::move(g));
                         });
  CKPTD_FAILPOINT("node.after_prepare", c->dir);
}

void PrepareAnswered(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     absl::StatusOr<GlobalStatus> g) {
  if (g.ok()) {
    {
      absl::MutexLock l(&core.mu);
      c->node->global = *g;
    }
    NodeCommitted(core, c);
    return;
  }
  const absl::Status s = g.status();
  Deferred d;
  absl::MutexLock l(&core.mu);
  if (core.stopping && !IsFinal(c->state)) {
    // Shutting down while prepared: the decision may still be commit. Keep
    // the files and the journal entry; recovery at the next start keeps
    // them if .metadata appeared, else removes them.
    c->cleaned = true;
    attempt::FailLocked(
        core, c,
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
      attempt::FailLocked(
          core, c, s, absl::IsCancelled(s) ? State::kCancelled : State::kFailed,
          d);
    }
  }
  attempt::TaskEndLocked(core, c, d);
}

void NodeCommitted(SaveCore& core, const std::shared_ptr<Checkpoint>& c) {
  bool committed = false;
  int64_t uid = kUnknownUid;
  std::shared_ptr<const TierCheckpoint> held = tasks::HoldInMemory(core, c);
  CommittedShare share;
  {
    Deferred d;
    absl::MutexLock l(&core.mu);
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
          absl::FormatDuration(core.clock->Now() - c->created));
      attempt::CommittedLocked(core, c, d);
      committed = true;
      uid = c->uid;
      share = {c->node->id, c->dir, g.nodes, std::move(held)};
      share.id.job = c->job;  // resolved (a trainer may leave it empty)
    }
    // A committed checkpoint's task ends after step 7 and the history (so
    // Shutdown waits for them: this runs on a gRPC thread, not the pool).
    if (!committed) attempt::TaskEndLocked(core, c, d);
  }
  if (committed) {
    // 7. (Retention of a multi-node checkpoint is its coordinator's.)
    tasks::SettleCommit(core,
                        {c->dir, c->job, uid, std::nullopt, false,
                         absl::ToUnixMillis(c->created)},
                        c->journal_path, {c->keep_last_n, c->keep_every},
                        /*retain=*/false);
    // Replicas of the node's share (peer_replicas), off the trainers' path.
    if (core.shares != nullptr) core.shares->Committed(std::move(share));
    attempt::TaskEnd(core, c);
  } else {
    core.tier.Drop(c->dir);
  }
}

void ResolveInDoubt(SaveCore& core, std::shared_ptr<Checkpoint> c,
                    absl::Status error) {
  // No writer runs any more: the plan, indexes and infos are settled.
  const bool committed =
      NodeDataCommitted(core.env, c->io_dir.empty() ? c->dir : c->io_dir,
                        c->local, c->LocalIndexes(), c->plan, c->infos);
  if (committed) {
    spdlog::warn(
        "checkpoint {}: the coordinator did not answer ({}), but .metadata "
        "lists this "
        "node's data: committed",
        c->dir, error);
    {
      absl::MutexLock l(&core.mu);
      ++c->busy_tasks;  // NodeCommitted ends one task
    }
    NodeCommitted(core, c);
  } else {
    Deferred d;
    absl::MutexLock l(&core.mu);
    if (!IsFinal(c->state)) {
      attempt::FailLocked(
          core, c,
          absl::Status(
              error.code(),
              fmt::format("no decision from coordinator {} and no .metadata "
                          "naming this node's data: {}",
                          c->node->coordinator, error.message())),
          State::kFailed, d);
    }
  }
  attempt::TaskEnd(core, c);
}

// ---------------------------------------------------------------------------
// Heartbeats and aborts
// ---------------------------------------------------------------------------

void HeartbeatLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     absl::Time now, Deferred& d) {
  ParticipantState& p = *c->node;
  const ParticipantTimeouts timeouts{
      core.options.peer_timeout, core.options.peer_heartbeat,
      core.options.commit_timeout,
      c->external_metadata ? c->metadata_timeout : absl::ZeroDuration()};
  const std::string last_error =
      p.last_peer_error.ok()
          ? ""
          : fmt::format("; last error: {}", p.last_peer_error);
  switch (NextHeartbeatStep(p, now, timeouts)) {
    case HeartbeatStep::kNothing:
      return;
    case HeartbeatStep::kUnreachable:
      attempt::FailLocked(
          core, c,
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
      attempt::SubmitLocked(core, c, [&core, c, error]() mutable {
        ResolveInDoubt(core, std::move(c), error);
      });
      return;
    }
    case HeartbeatStep::kSend:
      break;
  }
  p.heartbeat_in_flight = true;
  p.last_heartbeat = now;
  ++c->busy_tasks;
  d.Add([&core, c, link = p.link, id = p.id,
         progress = ProgressLocked(core, *c)]() mutable {
    link->Heartbeat(id, progress, [&core, c](absl::StatusOr<GlobalStatus> g) {
      LinkCallback scope(core);
      HeartbeatAnswered(core, c, std::move(g));
    });
  });
}

void HeartbeatAnswered(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                       absl::StatusOr<GlobalStatus> g) {
  Deferred d;
  absl::MutexLock l(&core.mu);
  ParticipantState& p = *c->node;
  p.heartbeat_in_flight = false;
  if (g.ok()) {
    p.last_contact = core.clock->Now();
    p.last_peer_error = absl::OkStatus();
    p.global = *g;
    if ((g->state == State::kFailed || g->state == State::kCancelled) &&
        !IsFinal(c->state)) {
      attempt::FailLocked(core, c,
                          g->error.ok()
                              ? absl::AbortedError("aborted by the coordinator")
                              : g->error,
                          g->state, d);
    } else if (g->state == State::kCommitted && p.prepare_sent &&
               !IsFinal(c->state) && !p.in_doubt) {
      // The answer to our prepare was lost; the decision was commit.
      p.in_doubt = true;
      ++c->busy_tasks;  // NodeCommitted ends one
      d.Add([&core, c] { NodeCommitted(core, c); });
    }
  } else {
    p.last_peer_error = g.status();
    if (absl::IsNotFound(g.status()) && p.prepare_sent && !IsFinal(c->state) &&
        !p.in_doubt) {
      // The coordinator forgot the checkpoint (it restarted): it will not
      // commit it now; .metadata decides.
      p.in_doubt = true;
      attempt::SubmitLocked(core, c, [&core, c, s = g.status()]() mutable {
        ResolveInDoubt(core, std::move(c), s);
      });
    }
  }
  attempt::TaskEndLocked(core, c, d);
}

void AbortAtCoordinatorLocked(SaveCore& core,
                              const std::shared_ptr<Checkpoint>& c,
                              absl::Status reason, Deferred& d) {
  ++c->busy_tasks;
  d.Add([&core, c, link = c->node->link, id = c->node->id, reason]() {
    link->Abort(id, reason,
                [&core, c, cancel = absl::IsCancelled(reason)](absl::Status s) {
                  LinkCallback scope(core);
                  if (!s.ok() && cancel) {
                    spdlog::warn(
                        "checkpoint {}: the coordinator refused the cancel: {}",
                        c->dir, s);
                  }
                  attempt::TaskEnd(core, c);
                });
  });
}

}  // namespace ckptd::daemon::save::cluster_link
