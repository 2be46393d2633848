// Copyright 2026 The ckptd Authors.
//
// The node planner: turns the node's rank indexes into the node's
// WritePlan (save_types.h) — which items each local rank writes, into which
// data file — once every local rank's index is in. Pure (no I/O, no locks).
//
//   single-node   PlanSingleNode: format::PlanSave over every rank (DCP's
//                 dedup of replicated items, validation, file assignment,
//                 the .metadata skeleton the committer completes)
//   multi-node    MakeNodeIndex → the coordinator's plan round (cluster/) →
//                 PlanFromCoordinator: the node's share of the global plan,
//                 checked against the node's own indexes
//
// Takes: RankIndex per rank (staging/); hands on: WritePlan (write/,
// commit/). Thread-safe (pure).
#ifndef CKPTD_DAEMON_PLAN_NODE_PLANNER_H_
#define CKPTD_DAEMON_PLAN_NODE_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/cluster/cluster.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon {

struct NodePlannerOptions {
  bool dedup_save_to_lowest_rank = false;
  // Items of all ranks together (max_items × world_size).
  uint64_t max_items = uint64_t{1} << 26;
};

// `ranks[r]`: rank r's index, for every rank of the world.
absl::StatusOr<WritePlan> PlanSingleNode(
    absl::Span<const RankIndex* const> ranks,
    const NodePlannerOptions& options);

// The node's index for the coordinator's plan round (copies the items).
NodeIndex MakeNodeIndex(absl::Span<const int> local_ranks,
                        absl::Span<const RankIndex* const> indexes);

// The coordinator's answer for `local_ranks` (ascending; `indexes` parallel
// to them) → the node's WritePlan for a world of `world_size` ranks.
// INTERNAL when the answer does not match the node's ranks and items or
// names a file other than __{rank}_0.distcp.
absl::StatusOr<WritePlan> PlanFromCoordinator(
    const NodePlan& plan, absl::Span<const int> local_ranks,
    absl::Span<const RankIndex* const> indexes, int world_size);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_PLAN_NODE_PLANNER_H_
