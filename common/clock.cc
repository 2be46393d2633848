// Copyright 2026 The ckptd Authors.
#include "common/clock.h"

#include "absl/time/clock.h"

namespace ckptd {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration d) override {
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();
  return clock;
}

SimulatedClock::SimulatedClock(absl::Time start) : now_(start) {}

absl::Time SimulatedClock::Now() const {
  absl::MutexLock l(&mu_);
  return now_;
}

void SimulatedClock::SleepFor(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  absl::MutexLock l(&mu_);
  now_ += d;
  slept_ += d;
}

void SimulatedClock::Advance(absl::Duration d) {
  absl::MutexLock l(&mu_);
  now_ += d;
}

absl::Duration SimulatedClock::slept() const {
  absl::MutexLock l(&mu_);
  return slept_;
}

}  // namespace ckptd
