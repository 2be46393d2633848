// Copyright 2026 The ckptd Authors.
//
// The states of a checkpoint and what queries show of one (Status, List,
// Wait, metrics). Shared by the orchestrator (checkpoint_manager.h), the
// node side of multi-node checkpoints (cluster/) and the service; no
// behaviour here.
//
//   PENDING → STAGING → WRITING → COMMITTING → COMMITTED
//   FAILED / CANCELLED from any state before COMMITTED.
#ifndef CKPTD_DAEMON_TYPES_CHECKPOINT_STATE_H_
#define CKPTD_DAEMON_TYPES_CHECKPOINT_STATE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ckptd::daemon {

enum class State : int {
  kPending = 1,
  kStaging = 2,
  kStaged = 3,
  kWriting = 4,
  kCommitting = 5,
  kCommitted = 6,
  kFailed = 7,
  kCancelled = 8,
};
std::string_view StateName(State state);
bool IsFinal(State state);

// "3, 5, 9" for messages naming ranks: at most `max_shown` of them, then
// ", ... (N more)".
std::string FormatRanks(const std::vector<int>& ranks, size_t max_shown = 16);

struct CheckpointInfo {
  std::string checkpoint_id;  // resolved absolute directory
  std::string job;
  State state = State::kPending;
  int world_size = 0;
  int ranks_staged = 0;
  uint64_t total_bytes = 0;
  uint64_t staged_bytes = 0;
  uint64_t written_bytes = 0;
  uint64_t file_bytes = 0;
  absl::Status error;  // FAILED / CANCELLED
  absl::Time created;
  absl::Time staged = absl::InfinitePast();    // InfinitePast: not yet
  absl::Time finished = absl::InfinitePast();  // InfinitePast: not yet
  uint64_t items = 0;
  uint32_t files = 0;
  // Multi-node: ranks_staged and the byte counts above are global (as of
  // the last heartbeat); these are the node's own.
  int num_nodes = 1;
  std::string coordinator;  // empty on the coordinator's node
  bool is_coordinator = false;
  int nodes_planned = 0;
  int nodes_prepared = 0;
  int local_ranks = 0;
  int local_ranks_staged = 0;
  uint64_t local_total_bytes = 0;
  uint64_t local_written_bytes = 0;
  uint64_t local_staged_bytes = 0;  // the node's own staged bytes
  // external_metadata: data durable, CommitMetadata awaited (kCommitting).
  bool awaiting_metadata = false;
  uint64_t memory_tier_bytes = 0;  // held by the memory tier
  // peer_replicas: where this node's share is held ("node 4 (addr) held"),
  // and whose shares this node holds ("node 2 (addr)").
  std::vector<std::string> replica_holders;
  std::vector<std::string> replicas_held;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_TYPES_CHECKPOINT_STATE_H_
