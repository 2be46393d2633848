// Copyright 2026 The ckptd Authors.
//
// The coordinator's inside (internal to coordinator*.cc): the record of
// each global checkpoint and of its nodes, and the class behind
// Coordinator. coordinator.cc answers the nodes' calls and runs the timers;
// coordinator_rounds.cc runs the plan round's planning and the commit
// (the durability steps of docs/durability.md that are the coordinator's).
//
// Locking: one mutex, mu_, guards globals_, cache_, tombstones_ and every
// Global / Node record. Once a round is past collecting (state > kPending),
// its task reads the inputs it took under mu_ (immutable descs and plan,
// moved-out storage); no I/O runs under mu_, and callbacks run after it is
// released (Deferred).
#ifndef CKPTD_DAEMON_CLUSTER_COORDINATOR_IMPL_H_
#define CKPTD_DAEMON_CLUSTER_COORDINATOR_IMPL_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/tasks.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/plan_cache.h"
#include "daemon/commit/checkpoint_dir.h"
#include "daemon/types/checkpoint_state.h"
#include "daemon/types/save_types.h"
#include "format/metadata/metadata.h"

namespace ckptd::daemon {

struct Node {
  int node = 0;
  uint64_t attempt = 0;
  std::string name;            // its peer address
  std::string failure_domain;  // as its Plan said
  std::vector<int> ranks;
  uint64_t digest = 0;
  std::shared_ptr<NodeIndex> index;  // until planned; null: cached
  PlanDone plan_waiter;
  bool planned = false;
  bool prepared = false;
  absl::Time prepared_at;
  std::vector<PrepareCall::Rank> storage;  // until the commit takes it
  PrepareDone prepare_waiter;
  absl::Time last_contact;
  NodeProgress progress;
};

struct Global {
  // Constant after creation.
  std::string dir;
  std::string checkpoint_id;
  std::string job;
  int world_size = 0;
  int num_nodes = 0;
  bool overwrite = false;
  bool dedup = false;
  int keep_last_n = 0;
  int64_t keep_every = 0;
  bool external = false;  // DCP's StorageWriter hands in the .metadata
  absl::Duration metadata_timeout;
  int zstd_level = 0;
  absl::Time created;
  // Guarded by the coordinator's mu_.
  // Step 1 opens the directory beneath its root without following symlinks
  // (CheckpointDir); the commit goes through io_dir, anchored to its fd.
  std::shared_ptr<CheckpointDir> dirh;
  std::string io_dir;
  State state = State::kPending;  // kPending: collecting indexes
  absl::Status error;
  std::map<int, Node> nodes;
  int ranks_claimed = 0;
  int nodes_planned = 0;
  int nodes_prepared = 0;
  bool committing = false;  // step 4 began: aborts are refused
  std::shared_ptr<const Descs> descs;
  std::shared_ptr<const format::SavePlan> plan;
  std::vector<size_t> kept;  // per rank: its items in the plan
  absl::Time finished = absl::InfinitePast();
  // external: every node durable and its files visible here (RunDurable),
  // the global layout built; awaiting CommitMetadata since then.
  absl::Time awaiting_since = absl::InfinitePast();
  std::shared_ptr<const format::Metadata> layout;  // storage_data, plan order
  DurableDone durable_waiter;  // the coordinator's node (AwaitDataDurable)
  // The nodes' attempts in the previous (finished) round of the same
  // directory, and how it ended: a node's Abort of its earlier attempt that
  // arrives after this round began is answered with that outcome, never
  // applied to this round (a failed save retried at once would otherwise
  // be killed by the first attempt's late Abort).
  std::map<int, uint64_t> earlier_attempts;
  State earlier_state = State::kPending;
  absl::Status earlier_error;
};

class Coordinator::Impl {
 public:
  explicit Impl(CoordinatorOptions o)
      : options_(std::move(o)), env_(options_.env) {}
  void Start();
  void Shutdown();

  void Plan(PlanCall call, PlanDone done);
  void Prepare(PrepareCall call, PrepareDone done);
  void Heartbeat(const PeerCallId& id, const NodeProgress& progress,
                 HeartbeatDone done);
  void Abort(const PeerCallId& id, absl::Status reason, AbortDone done);
  absl::StatusOr<GlobalStatus> Status(std::string_view checkpoint_id);
  // external_metadata (coordinator_external.cc; Coordinator's methods).
  void AwaitDataDurable(const PeerCallId& id, DurableDone done);
  absl::StatusOr<std::vector<LayoutEntry>> GlobalLayout(
      std::string_view checkpoint_id);
  absl::Status CommitMetadata(std::string_view checkpoint_id,
                              std::string bytes);
  // One pass of the timers at `now` (the timer thread: every 50 ms).
  void Tick(absl::Time now);

 private:
  // --- The nodes' calls (coordinator.cc) ---------------------------------
  // `dir`: the call's checkpoint id resolved (Resolve, before mu_).
  absl::Status PlanLocked(PlanCall& call, const std::string& dir,
                          PlanDone& done, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The collecting round for `dir`, or a new one (none yet, or only a
  // finished one); an abort tombstone refuses a call of the aborted save.
  absl::StatusOr<std::shared_ptr<Global>> RoundLocked(const PlanCall& call,
                                                      const std::string& dir,
                                                      const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The call against its round: options, ranks, a node's second index.
  absl::Status CheckNodeLocked(const Global& g, const PlanCall& call,
                               const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PrepareLocked(PrepareCall& call, const std::string& dir,
                             PrepareDone& done, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node's entry, checked against the call's attempt.
  absl::StatusOr<Node*> NodeLocked(Global& g, const PeerCallId& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Global> FindLocked(
      std::string_view checkpoint_id,
      const absl::StatusOr<std::string>& resolved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> Resolve(std::string_view checkpoint_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void FailLocked(Global& g, absl::Status error, State state, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  GlobalStatus StatusOfLocked(const Global& g)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TickGlobalLocked(Global& g, absl::Time now, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Housekeeping();

  // --- The rounds' tasks (coordinator_rounds.cc) -------------------------
  // What planning needs, taken under mu_: the cached plan, or every rank's
  // items (moved out of the nodes' indexes or copied from the cache).
  struct PlanInputs {
    std::shared_ptr<const Descs> descs;
    std::shared_ptr<const format::SavePlan> plan;  // set: cached
  };
  absl::StatusOr<PlanInputs> TakePlanInputsLocked(Global& g)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step 1 at the coordinator: the directory opened beneath its root, no
  // stale commit marker; records the directory in g.
  absl::Status PrepareDirectory(Global& g) ABSL_LOCKS_EXCLUDED(mu_);
  // The plan is made: each node is answered its part; the cache updated.
  void PlanMadeLocked(Global& g, const PlanInputs& in, bool cached,
                      absl::Time start, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunPlan(std::shared_ptr<Global> g);
  void RunCommit(std::shared_ptr<Global> g);
  // What RunCommit needs, taken from the Global under the lock.
  struct CommitInputs {
    std::string dir, io_dir;
    std::shared_ptr<const format::SavePlan> plan;
    std::shared_ptr<const Descs> descs;
    std::vector<PrepareCall::Rank> storage;  // per rank
  };
  static format::Metadata BuildMetadata(const CommitInputs& in);
  // Takes the nodes' storage out of g (under mu_): RunCommit's inputs.
  CommitInputs TakeCommitInputsLocked(Global& g)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // external: every node prepared → the files checked visible and the
  // global layout kept; the coordinator's node is told (durable_waiter).
  void RunDurable(std::shared_ptr<Global> g);
  // external: DCP's .metadata decoded, checked against the global layout
  // (CheckExternalMetadata) and published with steps 4–6.
  void RunExternalCommit(std::shared_ptr<Global> g, std::string bytes);
  // The global's commit window: commit_timeout, plus metadata_timeout
  // when it awaits DCP's .metadata.
  absl::Duration CommitWindow(const Global& g) const;
  absl::Status CheckFiles(const std::string& dir, const std::string& io_dir,
                          const format::Metadata& md);
  // Every node's prepare is younger than commit_timeout (checked again
  // just before the rename).
  absl::Status PreparesGood(const Global& g) ABSL_LOCKS_EXCLUDED(mu_);
  // Validation and steps 4–6 of `bytes` (the encoding of `md`).
  absl::Status Publish(const CommitInputs& in, const format::Metadata& md,
                       std::string_view bytes, const Global& g);
  void CommitDoneLocked(Global& g, const absl::Status& s, size_t items,
                        absl::Time start, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Constant after construction ---------------------------------------
  const CoordinatorOptions options_;
  Env* const env_;
  std::unique_ptr<ThreadPool> pool_;
  std::thread timer_;

  // --- Guarded by mu_ ----------------------------------------------------
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Global>> globals_
      ABSL_GUARDED_BY(mu_);
  PlanCache cache_ ABSL_GUARDED_BY(mu_);
  // Aborts from nodes that had not sent their index while no round was
  // collecting: they fail the nodes of that save that arrive later.
  struct Tombstone {
    absl::Status error;
    absl::Time at;
  };
  absl::flat_hash_map<std::string, Tombstone> tombstones_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_COORDINATOR_IMPL_H_
