// Copyright 2026 The ckptd Authors.
//
// The node side of a multi-node checkpoint (SaveBatch.cluster). The
// participant (cluster/participant.h) says what to send and how to decide;
// these functions make the CoordinatorLink calls and apply their outcomes
// to the attempt (cluster/cluster.h draws the rounds):
//
//   all local ranks indexed → RunNodePlan: steps 0–1 (journal with the
//     node's ranks, the shared directory; the coordinator deals with a
//     stale .metadata) → Plan call → ApplyNodePlan → writers (step 2)
//   every local rank written → RunNodePrepare: step 3 → Prepare call →
//     answered OK: NodeCommitted (step 7), else the abort
//   every tick: HeartbeatLocked (progress, unreachable coordinator, the
//     in-doubt decision from .metadata: ResolveInDoubt)
//
// A link's callbacks run on gRPC threads; each holds a LinkCallback
// (SaveCore::link_callbacks) for its whole body, so Shutdown waits for it.
#ifndef CKPTD_DAEMON_SAVE_CLUSTER_LINK_H_
#define CKPTD_DAEMON_SAVE_CLUSTER_LINK_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tasks.h"
#include "daemon/cluster/cluster.h"
#include "daemon/save/attempt.h"
#include "daemon/save/save_core.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon::save::cluster_link {

// The cluster of c's first batch: its local ranks (all of them when
// single-node) and, multi-node, the link to the coordinator.
absl::Status JoinClusterLocked(SaveCore& core, Checkpoint& c,
                               const SaveBatch& batch)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// This node's progress, as heartbeats and Prepare report it.
NodeProgress ProgressLocked(const SaveCore& core, const Checkpoint& c)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

// --- Plan round ------------------------------------------------------------

// The multi-node plan task: steps 0–1, then the Plan call (the index, or
// its digest when the coordinator has it cached).
void RunNodePlan(SaveCore& core, std::shared_ptr<Checkpoint> c);
// The Plan call with the node's index; its digest is remembered once the
// coordinator answered.
void SendPlan(SaveCore& core, std::shared_ptr<Checkpoint> c, PlanCall call);
// The coordinator's plan, made this node's WritePlan
// (tasks::ApplyPlanLocked), or the plan round's failure.
void ApplyNodePlan(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                   absl::StatusOr<NodePlan> plan);

// --- Commit round ----------------------------------------------------------

// Every local rank written: step 3, then the Prepare call.
void RunNodePrepare(SaveCore& core, std::shared_ptr<Checkpoint> c);
// The coordinator's decision (committed), or a failed call: the link's
// failure leaves the decision to the heartbeats, any other fails `c`.
void PrepareAnswered(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     absl::StatusOr<GlobalStatus> g);
// The coordinator committed `c`: the memory tier, COMMITTED, step 7.
void NodeCommitted(SaveCore& core, const std::shared_ptr<Checkpoint>& c);
// The coordinator could not be reached after this node prepared: the
// checkpoint committed iff .metadata lists this node's storage.
void ResolveInDoubt(SaveCore& core, std::shared_ptr<Checkpoint> c,
                    absl::Status error);

// --- Heartbeats and aborts -------------------------------------------------

// The heartbeat's step at `now` (participant.h NextHeartbeatStep): send
// one, fail an unreachable coordinator, or resolve an in-doubt decision.
void HeartbeatLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                     absl::Time now, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// The coordinator's global status, or the heartbeat's failure.
void HeartbeatAnswered(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                       absl::StatusOr<GlobalStatus> g);
// Asks the coordinator to abort `c` with `reason` (after the lock).
void AbortAtCoordinatorLocked(SaveCore& core,
                              const std::shared_ptr<Checkpoint>& c,
                              absl::Status reason, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

}  // namespace ckptd::daemon::save::cluster_link

#endif  // CKPTD_DAEMON_SAVE_CLUSTER_LINK_H_
