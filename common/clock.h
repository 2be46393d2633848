// Copyright 2026 The ckptd Authors.
//
// Clock: the time source of every control path of the daemon (timeouts,
// heartbeats, rate limits, journal names), injected through each
// component's Options so that tests can run timeouts on a SimulatedClock
// instead of sleeping.
//
//   Clock::Real()      absl::Now() / absl::SleepFor; thread-safe, immortal.
//   SimulatedClock     starts at a fixed instant and moves only when a test
//                      calls Advance() or a component calls SleepFor() (a
//                      simulated sleep advances the clock by its duration
//                      and returns at once, so a rate limiter's pauses are
//                      exact and instantaneous in tests).
//
// Only control paths read a Clock. Figures shown to people (durations in
// log lines) may use it too; benchmarks use their own real timers.
#ifndef CKPTD_COMMON_CLOCK_H_
#define CKPTD_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckptd {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Returns after `d` has passed on this clock (d <= 0: at once).
  virtual void SleepFor(absl::Duration d) = 0;

  // The wall clock. Never null, never destroyed.
  static Clock* Real();
};

// A clock that tests move by hand. Thread-safe.
class SimulatedClock final : public Clock {
 public:
  // 2026-01-01T00:00:00Z unless given.
  explicit SimulatedClock(absl::Time start = absl::FromUnixSeconds(1767225600));

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);
  // Advances the clock by `d` (a simulated sleep) and returns at once.
  void SleepFor(absl::Duration d) override ABSL_LOCKS_EXCLUDED(mu_);

  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  // Total simulated sleep so far (what SleepFor was asked for).
  absl::Duration slept() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration slept_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace ckptd

#endif  // CKPTD_COMMON_CLOCK_H_
