// Copyright 2026 The ckptd Authors.
//
// The staging pool: the daemon's one budget of client-arena bytes held at
// once (staging_budget), shared by every rank of every checkpoint, and the
// FIFO of Save batches waiting for room (backpressure).
//
//   Enqueue(token, arena_bytes)   a validated batch asks for room
//   Admit()                       the batches that now fit, in arrival
//                                 order, their bytes charged; one batch
//                                 always fits an idle pool, so a batch up
//                                 to max_batch always progresses
//   Release(bytes)                the writer consumed them (or a failed
//                                 checkpoint gave them back)
//
// Takes: Save call tokens and the arena bytes of their ValidatedBatch;
// hands on: the tokens admitted (the orchestrator adopts those batches).
// Device bytes (GPU path) are bounded by the pinned pool, not here: a batch
// of only device bytes is charged 0 and admitted in its turn.
//
// Thread-compatible: the orchestrator calls it under its lock. No I/O.
#ifndef CKPTD_DAEMON_STAGING_STAGING_POOL_H_
#define CKPTD_DAEMON_STAGING_STAGING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"

namespace ckptd::daemon {

struct StagingPoolOptions {
  uint64_t budget = uint64_t{4} << 30;  // staging_budget
  size_t max_waiting = 1024;            // max_pending_saves
};

class StagingPool {
 public:
  explicit StagingPool(StagingPoolOptions options) : options_(options) {}

  // RESOURCE_EXHAUSTED when max_waiting batches wait already.
  absl::Status CheckRoom() const;
  void Enqueue(uint64_t token, uint64_t arena_bytes);
  // The waiting batches that fit now, oldest first; their bytes are
  // charged. Stops at the first that does not fit (FIFO: no overtaking).
  std::vector<uint64_t> Admit();
  // A waiting batch leaves the queue uncharged (its checkpoint failed).
  // False if `token` is not waiting.
  bool Remove(uint64_t token);
  // Charged bytes given back.
  void Release(uint64_t bytes);

  uint64_t used() const { return used_; }
  size_t waiting() const { return queue_.size(); }
  uint64_t budget() const { return options_.budget; }

 private:
  struct Waiting {
    uint64_t token;
    uint64_t arena_bytes;
  };
  const StagingPoolOptions options_;
  std::deque<Waiting> queue_;
  uint64_t used_ = 0;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_STAGING_STAGING_POOL_H_
