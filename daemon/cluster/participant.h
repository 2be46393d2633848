// Copyright 2026 The ckptd Authors.
//
// The participant: this node's side of a multi-node checkpoint (cluster.h
// draws the rounds). What the node sends its coordinator and how it decides
// when the coordinator goes quiet, as plain state and pure functions; the
// orchestrator makes the CoordinatorLink calls and applies the outcomes.
//
//   MakePlanCall       plan round: the node's index (or its digest only,
//                      when the coordinator's plan cache has it)
//   MakePrepareCall    commit round: where the node's items landed, once
//                      its files are durable (steps 2–3 of
//                      docs/durability.md done on this node)
//   NextHeartbeatStep  every housekeeping tick: send progress, give up on
//                      an unreachable coordinator, or — once prepared and
//                      the coordinator can no longer commit — decide from
//                      `.metadata` (NodeDataCommitted)
//
// Takes: the node's RankIndexes, WritePlan and RankWriteResults; hands on:
// PlanCall / PrepareCall (cluster.h) and decisions. Thread-compatible: the
// orchestrator guards ParticipantState with its lock.
#ifndef CKPTD_DAEMON_CLUSTER_PARTICIPANT_H_
#define CKPTD_DAEMON_CLUSTER_PARTICIPANT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/env.h"
#include "daemon/cluster/cluster.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon {

// Per multi-node checkpoint, on each node.
struct ParticipantState {
  std::shared_ptr<CoordinatorLink> link;
  PeerCallId id;
  std::string coordinator;    // its peer address, "(this node)" on rank 0's
  GlobalStatus global;        // as of the last heartbeat
  bool plan_sent = false;     // the coordinator knows this node
  bool prepare_sent = false;  // local files durable, decision pending
  bool heartbeat_in_flight = false;
  bool in_doubt = false;  // resolving the decision from .metadata
  absl::Time prepare_sent_at = absl::InfinitePast();
  absl::Time last_heartbeat = absl::InfinitePast();  // sent
  absl::Time last_contact = absl::InfinitePast();    // answered
  absl::Status last_peer_error;
};

struct ParticipantTimeouts {
  absl::Duration peer_timeout = absl::Seconds(30);
  absl::Duration peer_heartbeat = absl::Seconds(1);
  absl::Duration commit_timeout = absl::Seconds(300);
  // external_metadata: the coordinator may also wait this long for DCP's
  // .metadata once every node prepared (zero otherwise).
  absl::Duration metadata_timeout = absl::ZeroDuration();
};

// What the plan round sends: the node's options and index (the index
// itself is attached by the caller, or left null for a digest-only call).
struct PlanCallSpec {
  int world_size = 0;
  int num_nodes = 0;
  bool overwrite = false;
  bool dedup_save_to_lowest_rank = false;
  int keep_last_n = 0;
  absl::Time started;
  int64_t keep_every = 0;
  bool external_metadata = false;
  absl::Duration metadata_timeout = absl::ZeroDuration();
  int zstd_level = 0;
};
PlanCall MakePlanCall(const PeerCallId& id, const PlanCallSpec& spec,
                      const NodeIndex& index);

// The commit round's call: for each local rank, the (offset, length) and
// stream transforms of each item it wrote, in item order.
PrepareCall MakePrepareCall(const PeerCallId& id,
                            absl::Span<const int> local_ranks,
                            const WritePlan& plan,
                            absl::Span<const format::StorageInfo> infos,
                            const NodeProgress& progress);

enum class HeartbeatStep {
  kNothing,      // not due, or a call is in flight, or already in doubt
  kUnreachable,  // not prepared and silent for peer_timeout: fail
  kResolve,      // prepared and the coordinator can no longer commit
  kSend,         // send progress
};
HeartbeatStep NextHeartbeatStep(const ParticipantState& p, absl::Time now,
                                const ParticipantTimeouts& timeouts);

// The decision of a prepared node whose coordinator went quiet: committed
// iff `.metadata` in `io_dir` places every item this node wrote where it
// wrote it (the coordinator removed any older `.metadata` before the plan
// round ended, so one found now is this checkpoint's).
bool NodeDataCommitted(Env* env, const std::string& io_dir,
                       absl::Span<const int> local_ranks,
                       absl::Span<const RankIndex* const> indexes,
                       const WritePlan& plan,
                       absl::Span<const format::StorageInfo> infos);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_PARTICIPANT_H_
