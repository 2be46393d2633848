// Copyright 2026 The ckptd Authors.
//
// Coordinator: the global half of a multi-node checkpoint, run by the daemon
// on global rank 0's node. It gathers every node's item index, makes one
// global plan (PlanSave: DCP's dedup across all ranks, file assignment),
// collects the nodes' prepares and commits with one .metadata — or aborts
// everywhere. gRPC-free: its own node calls it in-process, the peer server
// (peer_service.h) forwards the other nodes' calls.
//
// The durability steps (docs/durability.md; steps 0 and 2–3 are each
// node's, the rest the coordinator's):
//   1. (plan round) every node's index in → PlanSave; the directory is
//      created and an existing .metadata refused or, with overwrite,
//      removed durably (format::PrepareCheckpointDir), before any node is
//      told its plan (so no node writes a data file next to a stale marker);
//   validation: every node prepared (its files fsynced, their directory
//      entries fsynced), each within commit_timeout of its prepare; the plan
//      is checked against the nodes' storage (every planned item placed,
//      every data file visible here with its bytes: storage must be shared);
//   4–6. .metadata.tmp → fsync → (prepares still good) → rename → fsync dir
//      (format::PublishMetadata);
//   then the data files are checked again; a file gone (a node that gave
//      up) un-publishes .metadata and aborts; else COMMITTED and the nodes'
//      pending Prepare calls are answered OK.
// Aborts: a node's Abort, a node silent for peer_timeout, indexes missing
// after stage_timeout, prepares older than commit_timeout. An abort answers
// every pending Plan/Prepare call with the error, and every later Heartbeat
// carries it. Once step 4 has begun, aborts are refused (the decision is
// being made); a failure in 4–6 aborts.
//
// Thread-safety: all methods are thread-safe; callbacks never run with the
// coordinator's lock held.
#ifndef CKPTD_DAEMON_CLUSTER_COORDINATOR_H_
#define CKPTD_DAEMON_CLUSTER_COORDINATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/env.h"
#include "daemon/cluster/cluster.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon {

struct CoordinatorOptions {
  Env* env = nullptr;
  std::vector<std::string> checkpoint_roots;
  bool fsync = true;
  // Every node's index must be in this long after the first one.
  absl::Duration stage_timeout = absl::Seconds(120);
  // A node not heard from (plan, heartbeat, prepare) this long: abort.
  absl::Duration peer_timeout = absl::Seconds(30);
  // A node's prepare is good for this long; not all prepared by then: abort.
  absl::Duration commit_timeout = absl::Seconds(300);
  absl::Duration forget_after = absl::Hours(1);
  uint64_t max_items = 1u << 20;  // per rank
  int max_world_size = 1 << 16;
  // Runs after a commit (history, retention), off the coordinator's lock;
  // `started`: when the checkpoint's first index arrived.
  std::function<void(const std::string& job, const std::string& dir,
                     absl::Time started, int keep_last_n, int64_t keep_every)>
      on_commit;
  Clock* clock = Clock::Real();  // not owned
};

class Coordinator final : public CoordinatorLink {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      CoordinatorOptions options);
  // Aborts unfinished checkpoints and joins the threads.
  ~Coordinator() override;

  void Plan(PlanCall call, PlanDone done) override;
  void Prepare(PrepareCall call, PrepareDone done) override;
  void Heartbeat(PeerCallId id, NodeProgress progress,
                 HeartbeatDone done) override;
  void Abort(PeerCallId id, absl::Status reason, AbortDone done) override;

  // DCP's StorageWriter across nodes (PlanCall.external_metadata), for the
  // coordinator's own node; the other nodes' daemons never hand over a
  // .metadata. Instead of committing once every node prepared, the
  // coordinator checks every node's files visible, keeps the global layout
  // and waits (metadata_timeout) for the .metadata:
  //   AwaitDataDurable  `done` OK once every node is durable, else the abort
  //   GlobalLayout      every node's items: key, file, offset, length,
  //                     transforms (plan order)
  //   CommitMetadata    the pickled Metadata: decoded (restricted), checked
  //                     against the global layout (CheckExternalMetadata),
  //                     published with steps 4–6; the nodes' Prepare calls
  //                     carry the outcome. FAILED_PRECONDITION unless the
  //                     checkpoint awaits it.
  void AwaitDataDurable(PeerCallId id, DurableDone done);
  absl::StatusOr<std::vector<LayoutEntry>> GlobalLayout(
      std::string_view checkpoint_id);
  absl::Status CommitMetadata(std::string_view checkpoint_id,
                              std::string bytes);

  // The global state of a checkpoint (by id as given or resolved dir).
  absl::StatusOr<GlobalStatus> Status(std::string_view checkpoint_id);
  // One pass of the timers (stage_timeout, peer_timeout, commit_timeout,
  // forget_after) at `now` of the injected clock; a timer thread runs it
  // every 50 ms. Tests on a SimulatedClock advance it and call this.
  void TickForTest(absl::Time now);

 private:
  class Impl;
  explicit Coordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_COORDINATOR_H_
