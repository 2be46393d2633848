// Copyright 2026 The ckptd Authors.
//
// Intake: Save calls validated and adopted into an attempt. A call is
// checked against its attempt (made by the rank's first batch), its
// extents validated (staging/save_validator) and held; it then waits for
// staging budget (staging/staging_pool, backpressure) and, for CUDA
// buffers, for the GPU stager's copies; adopted, its extents join the
// rank's queue for its writer (tasks::ScheduleRankLocked). The last batch
// of every local rank indexed hands the attempt to its plan task
// (tasks::StartPlanLocked):
//
//   Save → SaveLocked → AttemptLocked (NewAttemptLocked) → CheckBatchLocked
//     → index (sequence 0) → StageBatchLocked → waiting for budget
//     → AdmitLocked → AdoptLocked (StageDeviceLocked → DeviceStaged first,
//       for device extents) → reply "staged" (last batch) or when consumed
#ifndef CKPTD_DAEMON_SAVE_INTAKE_H_
#define CKPTD_DAEMON_SAVE_INTAKE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tasks.h"
#include "daemon/save/attempt.h"
#include "daemon/save/save_core.h"
#include "daemon/staging/gpu_stager.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon::save {

// A validated batch waiting for staging budget (StagingPool) or for the
// GPU stager's copies.
struct PendingBatch {
  uint64_t token = 0;
  std::shared_ptr<Checkpoint> ckpt;
  int rank = 0;
  std::vector<StagedExtent> extents;
  uint64_t bytes = 0;
  uint64_t arena_bytes = 0;  // of `bytes`: held in the arena (the budget)
  std::vector<CudaBufferDesc> cuda_buffers;
  bool device_pending = false;  // device extents not yet copied to the pool
  bool last = false;
  SaveCallback done;
};

namespace intake {

// Handles one Save call (CheckpointManager::Save): `done` gets the reply or
// a precise error. Returns the call's token.
uint64_t Save(SaveCore& core, SaveBatch batch, SaveCallback done);
// Save under the lock, for the resolved directory `dir`; errors go to the
// caller (and fail the checkpoint where it exists).
absl::Status SaveLocked(SaveCore& core, SaveBatch& batch,
                        const std::string& dir, uint64_t token,
                        SaveCallback& done, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// The attempt a batch belongs to: the one in progress at its directory,
// or a new one (sequence 0).
absl::StatusOr<std::shared_ptr<Checkpoint>> AttemptLocked(
    SaveCore& core, SaveBatch& batch, const std::string& dir)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// A new attempt at `dir` from a rank's first batch (max_active_checkpoints;
// the cluster it belongs to: cluster_link::JoinClusterLocked).
absl::StatusOr<std::shared_ptr<Checkpoint>> NewAttemptLocked(
    SaveCore& core, SaveBatch& batch, const std::string& dir)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// Keeps at most kMaxFinishedKept settled checkpoints in core.ckpts.
void ForgetOldestFinishedLocked(SaveCore& core)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// A batch's rank, sequence and options against its checkpoint.
absl::Status CheckBatchLocked(const SaveCore& core, const Checkpoint& c,
                              const SaveBatch& batch)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// The batch's extents validated and, for an arena, held.
absl::StatusOr<std::unique_ptr<PendingBatch>> StageBatchLocked(SaveCore& core,
                                                               Checkpoint& c,
                                                               SaveBatch& batch)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

// Adopts waiting batches in arrival order while they fit the budget.
void AdmitLocked(SaveCore& core, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// The batch's extents join its rank's queue; its call is answered now (the
// last batch: "staged"; one held in the pinned pool) or once the writer
// consumed them (RankState::consume_done).
void AdoptLocked(SaveCore& core, PendingBatch& pb, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// The GPU path: the batch's device extents go to the stager; its copies
// done, DeviceStaged adopts the batch with the pinned pieces.
void StageDeviceLocked(SaveCore& core, std::unique_ptr<PendingBatch> pb,
                       Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
void DeviceStaged(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                  uint64_t token, absl::StatusOr<StageResult> result);

// Answers a batch that will not be adopted and gives back what it holds.
void DropBatchLocked(SaveCore& core, PendingBatch& pb,
                     const absl::Status& error, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// Gives back the arena bytes an extent holds (pinned or CUDA bytes: its
// `hold` frees them).
void ReleaseExtentLocked(SaveCore& core, const StagedExtent& e, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);
// For a failed `c` (attempt::FailLocked): its batches waiting for budget or
// at the GPU stager are dropped, the extents adopted but not yet written
// given back, and the reply owed to a non-last batch answered, with
// `error`.
void GiveBackLocked(SaveCore& core, const std::shared_ptr<Checkpoint>& c,
                    const absl::Status& error, Deferred& d)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

}  // namespace intake
}  // namespace ckptd::daemon::save

#endif  // CKPTD_DAEMON_SAVE_INTAKE_H_
