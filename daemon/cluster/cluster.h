// Copyright 2026 The ckptd Authors.
//
// Multi-node checkpoints: the plain structs that travel between a node's
// CheckpointManager and the checkpoint's coordinator, and the link between
// them. The coordinator is the daemon on global rank 0's node; its own
// node reaches it in-process (Coordinator implements CoordinatorLink), the
// other nodes over gRPC (peer_service.h). Nothing here knows gRPC.
//
//   node (CheckpointManager)                  coordinator (Coordinator)
//   all local ranks indexed ── Plan ────────▶ every node's index in: PlanSave
//        ◀──────────────────── NodePlan ───── (dedup across nodes, files)
//   local files durable ────── Prepare ─────▶ every node prepared: validate,
//        ◀──────────────────── OK / abort ─── write .metadata (steps 3–5)
//   every peer_heartbeat ───── Heartbeat ───▶ progress in, GlobalStatus out
//   failure / cancel ───────── Abort ───────▶ abort everywhere
#ifndef CKPTD_DAEMON_CLUSTER_CLUSTER_H_
#define CKPTD_DAEMON_CLUSTER_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "format/plan/save_plan.h"

namespace ckptd::daemon {

enum class State : int;

// Which checkpoint and node a message is about.
struct PeerCallId {
  std::string checkpoint_id;  // as the trainers gave it
  std::string job;
  int node = 0;           // the node's lowest global rank
  uint64_t attempt = 0;   // random id of the node's local checkpoint
  std::string node_name;  // "host:port", for messages
};

// One node's ranks and their items (the planner's input).
struct NodeIndex {
  std::vector<int> ranks;                            // ascending
  std::vector<std::vector<format::ItemDesc>> items;  // per rank
  std::vector<std::vector<uint64_t>> nbytes;         // per rank, per item
};

// A digest of an index: equal digests mean equal item lists (FNV-1a over a
// canonical encoding; used for the plan cache, not for security).
uint64_t IndexDigest(const NodeIndex& index);

// A node of a checkpoint as its coordinator knew it at the commit: where
// replicas of its share go (placement.h).
struct ClusterNode {
  int node = 0;                // its lowest global rank
  std::string address;         // its peer address ("host:port")
  std::string failure_domain;  // failure_domain; empty: its own
};

struct PlanCall {
  PeerCallId id;
  std::string failure_domain;  // the node's failure_domain setting
  int world_size = 0;
  int num_nodes = 0;
  bool overwrite = false;
  bool dedup_save_to_lowest_rank = false;
  int keep_last_n = 0;
  int64_t keep_every = 0;
  // Options every node must agree on (a node that differs is refused):
  // DCP's StorageWriter hands the .metadata to the coordinator's node, which
  // waits metadata_timeout for it once every node is durable; zstd_level 0
  // is no compression.
  bool external_metadata = false;
  absl::Duration metadata_timeout = absl::ZeroDuration();
  int zstd_level = 0;
  uint64_t index_digest = 0;
  absl::Time started;                      // the node's first request for it
  std::vector<int> ranks;                  // the node's ranks
  std::vector<size_t> item_counts;         // per rank: its items
  std::shared_ptr<const NodeIndex> index;  // null: use the cached one
};

// The coordinator's answer to one node: which items each rank writes.
struct NodePlan {
  struct Rank {
    int rank = 0;
    std::vector<bool> keep;  // per item of the rank
    std::string file;        // empty: the rank writes no file
  };
  std::vector<Rank> ranks;  // the node's ranks, ascending
  bool cached = false;
};

struct NodeProgress {
  State state{};
  int ranks_staged = 0;
  uint64_t total_bytes = 0;
  uint64_t staged_bytes = 0;
  uint64_t written_bytes = 0;
};

struct PrepareCall {
  PeerCallId id;
  struct Rank {
    int rank = 0;
    std::vector<uint64_t> offset;  // per written item, in item order
    std::vector<uint64_t> length;
    // Per written item: its payload's stream transforms ("stream.zstd/1"),
    // as the writer recorded them; empty when no item has any.
    std::vector<std::vector<std::string>> transforms;
  };
  std::vector<Rank> ranks;
  NodeProgress progress;  // the node's final figures
};

struct GlobalStatus {
  State state{};
  int num_nodes = 0;
  int nodes_planned = 0;
  int nodes_prepared = 0;
  int ranks_staged = 0;
  uint64_t total_bytes = 0;
  uint64_t staged_bytes = 0;
  uint64_t written_bytes = 0;
  absl::Status error;  // FAILED / CANCELLED
  // Once committed (the answer to Prepare): every node, ascending.
  std::vector<ClusterNode> nodes;
};

// FAILED_PRECONDITION message the coordinator answers a digest-only Plan
// with when it has no index cached for it; the node resends with the index.
inline constexpr char kIndexNotCached[] = "index not cached";

using PlanDone = absl::AnyInvocable<void(absl::StatusOr<NodePlan>) &&>;
// OK: committed (with the final global status); else the abort.
using PrepareDone = absl::AnyInvocable<void(absl::StatusOr<GlobalStatus>) &&>;
using AbortDone = absl::AnyInvocable<void(absl::Status) &&>;
using HeartbeatDone = absl::AnyInvocable<void(absl::StatusOr<GlobalStatus>) &&>;
// external_metadata: OK once every node is durable (the .metadata is
// awaited), else the abort.
using DurableDone = absl::AnyInvocable<void(absl::Status) &&>;

// A node's way to its checkpoint's coordinator. Callbacks run exactly once,
// on any thread, never inline with a caller's lock held by the link.
class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  // Answered when every node's index is in and planned, or on abort.
  virtual void Plan(PlanCall call, PlanDone done) = 0;
  // Answered OK once .metadata is durable (committed), else the abort.
  virtual void Prepare(PrepareCall call, PrepareDone done) = 0;
  virtual void Heartbeat(PeerCallId id, NodeProgress progress,
                         HeartbeatDone done) = 0;
  // Best effort; `done` may be empty.
  virtual void Abort(PeerCallId id, absl::Status reason, AbortDone done) = 0;
  // Cancels the calls in flight (their callbacks run with CANCELLED); for
  // shutting down without waiting out long-polls.
  virtual void CancelCalls() {}
};

// Makes links to remote coordinators ("host:port"); set by the daemon from
// its peer configuration (token, TLS, timeouts). Tests inject their own.
using LinkFactory =
    std::function<absl::StatusOr<std::shared_ptr<CoordinatorLink>>(
        const std::string& address)>;

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_CLUSTER_H_
