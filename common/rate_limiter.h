// Copyright 2026 The ckptd Authors.
//
// RateLimiter: keeps a stream of bytes under a rate (bytes/s): the
// data-file writes of every checkpoint together under write_rate_limit, so
// that checkpoint writes do not starve the job's own I/O; the replicas a
// daemon pushes to its peers under replica_rate_limit. A writer asks for each
// piece before appending it and is paused until the piece fits the rate (pieces
// are granted in request order, back to back).
//
// Time comes from the injected Clock: on a SimulatedClock the pauses
// advance the clock instead of sleeping, so tests check exact figures.
// Thread-safe.
#ifndef CKPTD_COMMON_RATE_LIMITER_H_
#define CKPTD_COMMON_RATE_LIMITER_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ckptd {

class RateLimiter {
 public:
  // bytes_per_second 0: unlimited (Acquire returns at once).
  RateLimiter(uint64_t bytes_per_second, Clock* clock)
      : rate_(bytes_per_second), clock_(clock) {}

  // Returns once `bytes` fit the rate, or as soon as `aborted` is seen true
  // (checked at least every 20 ms of the pause).
  void Acquire(uint64_t bytes, const std::atomic<bool>& aborted)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t rate_;
  Clock* const clock_;
  absl::Mutex mu_;
  // When the next piece may start (the end of the last one granted).
  absl::Time next_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ckptd

#endif  // CKPTD_COMMON_RATE_LIMITER_H_
