// Copyright 2026 The ckptd Authors.
//
// DaemonMetrics: ckptd's metrics (docs/metrics.md lists them) and its health
// check, behind the HTTP endpoint (http_server.h). Counters and histograms
// are fed by the manager's checkpoint events (CheckpointObserver); gauges are
// read from the manager's public API at scrape time.
//
// Lifecycle (daemon_main.cc): construct; pass as DaemonOptions::observer to
// CheckpointManager::Create; SetManager(manager) once it is up and
// SetServing(true) once the trainer service serves; SetServing(false) and
// SetManager(nullptr) before the manager is destroyed.
//
// Thread-safety: all methods are thread-safe.
#ifndef CKPTD_DAEMON_METRICS_DAEMON_METRICS_H_
#define CKPTD_DAEMON_METRICS_DAEMON_METRICS_H_

#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/metrics/metrics.h"
#include "daemon/restore/restore_types.h"
#include "daemon/save/checkpoint_manager.h"

namespace ckptd::daemon {

class DaemonMetrics : public CheckpointObserver, public RestoreObserver {
 public:
  // `start_time`: the process start (ckptd_process_start_time_seconds).
  DaemonMetrics(std::string version, absl::Time start_time);

  // The manager read at scrape time and by Health(); nullptr: none (not up
  // yet, or going away). Blocks until a scrape in progress is done with the
  // previous one.
  void SetManager(CheckpointManager* manager);
  // Whether the trainer service accepts calls (Health() is 503 otherwise).
  void SetServing(bool serving);

  // The body of GET /metrics.
  std::string Render() const { return registry_.Render(); }
  // OK when the daemon serves and its directories are usable; otherwise
  // UNAVAILABLE with the reason (GET /healthz → 503).
  absl::Status Health() const;

  MetricsRegistry& registry() { return registry_; }

  // Peer calls of multi-node checkpoints (PeerCallObserver): answered by
  // this daemon's peer service (coordinator side) and made by this daemon
  // to a coordinator (participant side), by method and status code.
  void PeerRequest(std::string_view method, absl::StatusCode code);
  void PeerCall(std::string_view method, absl::StatusCode code);

  // CheckpointObserver (called with the manager's lock held).
  void CheckpointFinished(const CheckpointInfo& info) override;
  void SaveRejected(const absl::Status& error) override;
  // RestoreObserver.
  void RestoreBatchRead(int ranks, uint64_t storage_bytes) override;
  void RestoreAnswered(absl::StatusCode code, uint64_t copied_bytes) override;
  void RestoreFileBytesRead(uint64_t bytes) override;
  void RestorePeerBytesRead(uint64_t bytes) override;

 private:
  void Collect();  // the registry's collector

  MetricsRegistry registry_;
  // Constant after construction (owned by registry_).
  GaugeFamily* checkpoints_;
  GaugeFamily* active_bytes_;
  CounterFamily* finished_;
  CounterFamily* bytes_staged_;
  CounterFamily* bytes_written_;
  HistogramFamily* stall_;
  HistogramFamily* commit_;
  HistogramFamily* end_to_end_;
  CounterFamily* errors_;
  CounterFamily* restore_calls_;
  CounterFamily* restore_batches_;
  CounterFamily* restore_bytes_;
  Counter* restore_file_bytes_;  // restore_bytes_ {source="files"}
  Counter* restore_peer_bytes_;  // restore_bytes_ {source="peer"}
  GaugeFamily* budget_;
  GaugeFamily* in_use_;
  GaugeFamily* arenas_;
  GaugeFamily* max_arenas_;
  GaugeFamily* cuda_ipc_;
  GaugeFamily* multinode_;
  CounterFamily* multinode_finished_;
  GaugeFamily* pinned_bytes_;
  GaugeFamily* pinned_in_use_;
  GaugeFamily* tier_bytes_;
  CounterFamily* recovered_;
  CounterFamily* peer_requests_;
  CounterFamily* peer_calls_;
  GaugeFamily* serving_gauge_;

  mutable absl::Mutex mu_;
  CheckpointManager* manager_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool recovery_counted_ ABSL_GUARDED_BY(mu_) = false;
  // The memory tier's served bytes already added to restore_bytes_.
  uint64_t tier_served_counted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tier_lent_counted_ ABSL_GUARDED_BY(mu_) = 0;  // likewise, lent
};

// Whether `dir` is a directory this process can write (or, when missing and
// `may_be_created`, its nearest existing ancestor, where it would be
// created); UNAVAILABLE with the reason if not.
absl::Status CheckDirUsable(const std::string& dir, bool may_be_created = true);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_METRICS_DAEMON_METRICS_H_
