// Copyright 2026 The ckptd Authors.

#include "daemon/metrics/daemon_metrics.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "daemon/tier/memory_tier.h"
#include "fmt/format.h"

namespace ckptd::daemon {
namespace {

constexpr State kAllStates[] = {
    State::kPending,    State::kStaging,   State::kStaged, State::kWriting,
    State::kCommitting, State::kCommitted, State::kFailed, State::kCancelled};

// A state's label value: "committed" etc.
std::string StateLabel(State s) {
  return absl::AsciiStrToLower(std::string(StateName(s)));
}

// "RESOURCE_EXHAUSTED" etc. (absl::StatusCodeToString).
std::string CodeName(const absl::Status& s) {
  return absl::StatusCodeToString(s.code());
}

double Seconds(absl::Time from, absl::Time to) {
  return absl::ToDoubleSeconds(to - from);
}

bool Known(absl::Time t) { return t != absl::InfinitePast(); }

// Trainer stalls: milliseconds to minutes.
const std::vector<double> kStallBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1,     2.5,    5,     10,   25,    50,   100, 250,  500};
// Writes and commits: tens of milliseconds to about an hour.
const std::vector<double> kCommitBuckets = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,    2.5,  5,
    10,   25,    50,   100, 250,  500, 1000, 2500, 5000};

}  // namespace

DaemonMetrics::DaemonMetrics(std::string version, absl::Time start_time) {
  MetricsRegistry& r = registry_;
  r.AddGauge("ckptd_build_info",
             "Always 1; the label carries the daemon's version.", {"version"})
      ->WithLabels({version})
      ->Set(1);
  r.AddGauge("ckptd_process_start_time_seconds",
             "Start time of the daemon since the Unix epoch, in seconds.")
      ->Get()
      ->Set(absl::ToDoubleSeconds(start_time - absl::UnixEpoch()));
  serving_gauge_ = r.AddGauge(
      "ckptd_serving",
      "1 while the trainer service accepts calls (see /healthz), else 0.");
  checkpoints_ = r.AddGauge(
      "ckptd_checkpoints",
      "Checkpoints the daemon currently knows (in memory), by state; "
      "finished ones stay listed for forget_after.",
      {"state"});
  for (State s : kAllStates) checkpoints_->WithLabels({StateLabel(s)});
  active_bytes_ = r.AddGauge(
      "ckptd_active_checkpoint_bytes",
      "Bytes of this node's unfinished checkpoints: kind=total (to save), "
      "staged, written.",
      {"kind"});
  for (const char* k : {"total", "staged", "written"}) {
    active_bytes_->WithLabels({k});
  }
  finished_ = r.AddCounter(
      "ckptd_checkpoints_finished_total",
      "Checkpoints that reached a final state, by outcome (committed, failed, "
      "cancelled).",
      {"outcome"});
  for (const char* o : {"committed", "failed", "cancelled"}) {
    finished_->WithLabels({o});
  }
  bytes_staged_ = r.AddCounter(
      "ckptd_bytes_staged_total",
      "Bytes this node staged (took from trainers' arenas), counted when "
      "their checkpoint finishes.");
  bytes_written_ = r.AddCounter(
      "ckptd_bytes_written_total",
      "Bytes of data files this node wrote, counted when their checkpoint "
      "finishes.");
  stall_ = r.AddHistogram(
      "ckptd_trainer_stall_seconds",
      "Per checkpoint: from its first Save call to all of this node's ranks "
      "staged (the trainers' stall); observed when the checkpoint finishes.",
      kStallBuckets);
  commit_ = r.AddHistogram(
      "ckptd_commit_latency_seconds",
      "Per committed checkpoint: from all local ranks staged to committed "
      "(planning, writing, fsync, commit).",
      kCommitBuckets);
  end_to_end_ = r.AddHistogram(
      "ckptd_checkpoint_latency_seconds",
      "Per committed checkpoint: from its first Save call to committed.",
      kCommitBuckets);
  errors_ = r.AddCounter(
      "ckptd_errors_total",
      "Errors by status code and stage: validation (a Save call rejected), "
      "staging (a checkpoint failed before all its local ranks were staged), "
      "persisting (failed while planning, writing or committing).",
      {"code", "stage"});
  peer_requests_ = r.AddCounter(
      "ckptd_peer_requests_total",
      "Peer calls this daemon's peer service answered (coordinator side), "
      "by method and status code; UNAUTHENTICATED: a missing or wrong peer "
      "token.",
      {"method", "code"});
  peer_calls_ = r.AddCounter(
      "ckptd_peer_calls_total",
      "Peer calls this daemon made to a coordinator (participant side), by "
      "method and status code; UNAVAILABLE / DEADLINE_EXCEEDED: the "
      "coordinator could not be reached in time.",
      {"method", "code"});
  restore_calls_ = r.AddCounter(
      "ckptd_restore_calls_total",
      "Restore calls answered (one per rank and batch), by status code.",
      {"code"});
  restore_batches_ = r.AddCounter(
      "ckptd_restore_group_batches_total",
      "Group batches served: batch k of the local ranks of one restore, "
      "read once for all of them.");
  restore_bytes_ = r.AddCounter(
      "ckptd_restore_bytes_total",
      "Restored bytes by source: storage (payload bytes read from the "
      "checkpoint's files, once per group batch, the memory tier's "
      "included), memory (bytes of those the memory tier served), lent "
      "(bytes not read at all: the ranks copied them straight out of "
      "files the memory tier lent them) and delivered (bytes handed to "
      "the ranks; delivered / (storage + lent) is the sharing of the "
      "node's ranks); files: bytes read from the checkpoint's data files "
      "on storage (reads and CRC checks, not the memory tier's); peer: "
      "bytes fetched from other daemons' memory (peer_replicas).",
      {"source"});
  restore_file_bytes_ = restore_bytes_->WithLabels({"files"});
  restore_peer_bytes_ = restore_bytes_->WithLabels({"peer"});
  tier_bytes_ = r.AddGauge(
      "ckptd_memory_tier_bytes",
      "The memory tier: kind=budget (option memory_tier_bytes), kind=used "
      "(held checkpoints and captures in progress).",
      {"kind"});
  budget_ = r.AddGauge("ckptd_staging_budget_bytes",
                       "The staging budget (option staging_budget).");
  in_use_ = r.AddGauge(
      "ckptd_staged_bytes_in_use",
      "Bytes of arenas currently held by checkpoints (staged, not yet "
      "written); at most ckptd_staging_budget_bytes.");
  arenas_ = r.AddGauge("ckptd_arenas_registered",
                       "Shared-memory arenas currently registered.");
  max_arenas_ = r.AddGauge("ckptd_arenas_max",
                           "The limit on registered arenas (option "
                           "max_arenas).");
  multinode_ =
      r.AddGauge("ckptd_multinode_checkpoints",
                 "Unfinished multi-node checkpoints on this node, by its role: "
                 "coordinator (rank 0's node) or participant.",
                 {"role"});
  multinode_finished_ = r.AddCounter(
      "ckptd_multinode_checkpoints_finished_total",
      "Multi-node checkpoints this node took part in, by role and outcome "
      "(committed, failed, cancelled).",
      {"role", "outcome"});
  cuda_ipc_ = r.AddGauge("ckptd_cuda_ipc",
                         "1 when the daemon stages CUDA IPC handles (the GPU "
                         "path), 0 when device tensors must come as host "
                         "bytes (no driver or GPU, or cuda=off).");
  pinned_bytes_ = r.AddGauge("ckptd_pinned_staging_bytes",
                             "The pinned staging pool for device bytes "
                             "(option pinned_staging_bytes; 0 without CUDA).");
  pinned_in_use_ = r.AddGauge(
      "ckptd_pinned_staging_bytes_in_use",
      "Bytes of the pinned pool holding device bytes not yet written.");
  recovered_ = r.AddCounter(
      "ckptd_recovered_checkpoints_total",
      "Unfinished checkpoints found at start-up, by result: removed, "
      "completed (had .metadata), error (could not be cleaned up), deferred "
      "(a node's share of a multi-node checkpoint, decided once its "
      "coordinator can no longer commit it).",
      {"result"});
  for (const char* o : {"removed", "completed", "error"}) {
    recovered_->WithLabels({o});
  }
  r.AddCollector([this] { Collect(); });
}

void DaemonMetrics::SetManager(CheckpointManager* manager) {
  absl::MutexLock l(&mu_);
  manager_ = manager;
}

void DaemonMetrics::SetServing(bool serving) {
  absl::MutexLock l(&mu_);
  serving_ = serving;
}

void DaemonMetrics::Collect() {
  absl::MutexLock l(&mu_);
  serving_gauge_->Get()->Set(serving_ && manager_ != nullptr ? 1 : 0);
  if (manager_ == nullptr) return;
  const DaemonOptions& o = manager_->options();
  budget_->Get()->Set(static_cast<double>(o.staging_budget));
  max_arenas_->Get()->Set(o.max_arenas);
  in_use_->Get()->Set(static_cast<double>(manager_->staged_bytes_in_use()));
  arenas_->Get()->Set(manager_->arenas_registered());
  const CudaInfo cuda = manager_->cuda_info();
  cuda_ipc_->Get()->Set(cuda.available ? 1 : 0);
  pinned_bytes_->Get()->Set(static_cast<double>(cuda.pinned_bytes));
  pinned_in_use_->Get()->Set(static_cast<double>(cuda.pinned_in_use));
  const MemoryTier* tier = manager_->memory_tier();
  tier_bytes_->WithLabels({"budget"})->Set(static_cast<double>(tier->budget()));
  tier_bytes_->WithLabels({"used"})->Set(static_cast<double>(tier->used()));
  // Served from memory: counted by the tier's files as restores read them.
  const uint64_t served = tier->served();
  restore_bytes_->WithLabels({"memory"})
      ->Increment(static_cast<double>(served - tier_served_counted_));
  tier_served_counted_ = served;
  const uint64_t lent = tier->lent();
  restore_bytes_->WithLabels({"lent"})->Increment(
      static_cast<double>(lent - tier_lent_counted_));
  tier_lent_counted_ = lent;
  if (!recovery_counted_) {
    recovery_counted_ = true;
    const RecoveryReport& rec = manager_->recovery();
    recovered_->WithLabels({"removed"})->Increment(rec.removed.size());
    recovered_->WithLabels({"completed"})->Increment(rec.completed.size());
    recovered_->WithLabels({"error"})->Increment(rec.errors.size());
    recovered_->WithLabels({"deferred"})->Increment(rec.deferred.size());
  }
  std::map<State, int> by_state;
  uint64_t total = 0, staged = 0, written = 0;
  int coordinating = 0, participating = 0;
  for (const CheckpointInfo& c : manager_->List("", false)) {
    ++by_state[c.state];
    if (!IsFinal(c.state) && c.num_nodes > 1) {
      ++(c.is_coordinator ? coordinating : participating);
    }
    if (!IsFinal(c.state)) {
      total += c.local_total_bytes;
      staged += c.local_staged_bytes;
      written += c.local_written_bytes;
    }
  }
  for (State s : kAllStates) {
    checkpoints_->WithLabels({StateLabel(s)})->Set(by_state[s]);
  }
  multinode_->WithLabels({"coordinator"})->Set(coordinating);
  multinode_->WithLabels({"participant"})->Set(participating);
  active_bytes_->WithLabels({"total"})->Set(static_cast<double>(total));
  active_bytes_->WithLabels({"staged"})->Set(static_cast<double>(staged));
  active_bytes_->WithLabels({"written"})->Set(static_cast<double>(written));
}

void DaemonMetrics::CheckpointFinished(const CheckpointInfo& info) {
  const std::string outcome = StateLabel(info.state);
  finished_->WithLabels({outcome})->Increment();
  if (info.num_nodes > 1) {
    multinode_finished_
        ->WithLabels(
            {info.is_coordinator ? "coordinator" : "participant", outcome})
        ->Increment();
  }
  bytes_staged_->Get()->Increment(static_cast<double>(info.local_staged_bytes));
  bytes_written_->Get()->Increment(
      static_cast<double>(info.local_written_bytes));
  const bool staged = Known(info.staged);
  if (staged) stall_->Get()->Observe(Seconds(info.created, info.staged));
  if (info.state == State::kCommitted && Known(info.finished)) {
    if (staged) commit_->Get()->Observe(Seconds(info.staged, info.finished));
    end_to_end_->Get()->Observe(Seconds(info.created, info.finished));
  }
  if (info.state == State::kFailed) {
    errors_
        ->WithLabels({CodeName(info.error), staged ? "persisting" : "staging"})
        ->Increment();
  }
}

void DaemonMetrics::SaveRejected(const absl::Status& error) {
  errors_->WithLabels({CodeName(error), "validation"})->Increment();
}

void DaemonMetrics::RestoreBatchRead(int ranks, uint64_t storage_bytes) {
  (void)ranks;
  restore_batches_->Get()->Increment();
  restore_bytes_->WithLabels({"storage"})
      ->Increment(static_cast<double>(storage_bytes));
}

void DaemonMetrics::RestoreFileBytesRead(uint64_t bytes) {
  restore_file_bytes_->Increment(static_cast<double>(bytes));
}

void DaemonMetrics::RestorePeerBytesRead(uint64_t bytes) {
  restore_peer_bytes_->Increment(static_cast<double>(bytes));
}

void DaemonMetrics::RestoreAnswered(absl::StatusCode code,
                                    uint64_t copied_bytes) {
  restore_calls_->WithLabels({CodeName(absl::Status(code, ""))})->Increment();
  restore_bytes_->WithLabels({"delivered"})
      ->Increment(static_cast<double>(copied_bytes));
}

absl::Status CheckDirUsable(const std::string& dir, bool may_be_created) {
  std::string d = dir;
  while (true) {
    struct stat st;
    if (::stat(d.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return absl::UnavailableError(fmt::format("{} is not a directory", d));
      }
      if (::access(d.c_str(), W_OK | X_OK) != 0) {
        return absl::UnavailableError(
            fmt::format("{} is not writable: {}", d, std::strerror(errno)));
      }
      return absl::OkStatus();
    }
    if (errno != ENOENT || !may_be_created) {
      return absl::UnavailableError(
          fmt::format("{}: {}", d, std::strerror(errno)));
    }
    const size_t slash = d.find_last_of('/');
    if (slash == std::string::npos || d == "/") {
      return absl::UnavailableError(fmt::format("{} does not exist", dir));
    }
    d = slash == 0 ? "/" : d.substr(0, slash);
  }
}

absl::Status DaemonMetrics::Health() const {
  absl::MutexLock l(&mu_);
  if (manager_ == nullptr) {
    return absl::UnavailableError(
        "the checkpoint manager is not up (start-up recovery not finished, "
        "or shutting down)");
  }
  if (!serving_) {
    return absl::UnavailableError(
        "the trainer service is not serving (starting or shutting down)");
  }
  const DaemonOptions& o = manager_->options();
  // The state directory was created at start-up; roots may be made later.
  if (absl::Status s = CheckDirUsable(o.state_dir, /*may_be_created=*/false);
      !s.ok()) {
    return absl::UnavailableError(
        fmt::format("state_dir: {}", std::string(s.message())));
  }
  for (const std::string& root : o.checkpoint_roots) {
    if (absl::Status s = CheckDirUsable(root); !s.ok()) {
      return absl::UnavailableError(
          fmt::format("checkpoint root: {}", std::string(s.message())));
    }
  }
  return absl::OkStatus();
}

void DaemonMetrics::PeerRequest(std::string_view method,
                                absl::StatusCode code) {
  peer_requests_
      ->WithLabels({std::string(method), absl::StatusCodeToString(code)})
      ->Increment();
}

void DaemonMetrics::PeerCall(std::string_view method, absl::StatusCode code) {
  peer_calls_->WithLabels({std::string(method), absl::StatusCodeToString(code)})
      ->Increment();
}

}  // namespace ckptd::daemon
